"""What tests share that is not a fixture: sandboxes, a running daemon, the network lab, documents."""
