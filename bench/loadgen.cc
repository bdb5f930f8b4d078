// A gRPC load generator for bench/check.py, for measuring what a server can serve when its callers
// cost little CPU. The Python clients (grpc.aio) spend about as much CPU per call as the daemon does,
// so on a 2-core machine they measure the callers as much as the server. This one uses the C++
// library's generic stub: the same wire calls (unary, raw request bytes, 5 s deadline), one channel
// and one connection per caller and service, one call at a time per caller.
//
// Build: g++ -O2 -std=c++17 -o loadgen bench/loadgen.cc $(pkg-config --cflags --libs grpc++)
//        (Debian: apt-get install libgrpc++-dev pkg-config)
//
// Reads its job from stdin, one item per line:
//   callers N
//   payload HEX                          the request message, hex-encoded
//   target KIND SOCKET_PATH METHOD       e.g. check /tmp/x/api.sock /enforcer.v1.Enforcer/Check
//   window KIND START END                wall-clock seconds (time.time()), in order
// Writes one line per window: "KIND ERRORS LATENCY_NS..." with every caller's latencies.

#include <grpcpp/grpcpp.h>
#include <grpcpp/generic/generic_stub.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Target {
  std::string path, method;
};

struct Window {
  std::string kind;
  double start, end;
};

struct Job {
  int callers = 0;
  std::string payload;
  std::map<std::string, Target> targets;
  std::vector<Window> windows;
};

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

Job read_job(std::istream& in) {
  Job job;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string item;
    words >> item;
    if (item == "callers") {
      words >> job.callers;
    } else if (item == "payload") {
      std::string hex;
      words >> hex;
      job.payload = from_hex(hex);
    } else if (item == "target") {
      std::string kind;
      Target t;
      words >> kind >> t.path >> t.method;
      job.targets[kind] = t;
    } else if (item == "window") {
      Window w;
      words >> w.kind >> w.start >> w.end;
      job.windows.push_back(w);
    } else if (!item.empty()) {
      throw std::runtime_error("unknown job line: " + line);
    }
  }
  return job;
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class Caller {
 public:
  Caller(const Job& job, int index) : job_(job) {
    for (const auto& [kind, target] : job.targets) {
      grpc::ChannelArguments args;
      args.SetInt("loadgen.caller", index);  // a distinct argument: a connection of its own
      auto channel = grpc::CreateCustomChannel("unix:" + target.path, grpc::InsecureChannelCredentials(), args);
      stubs_.emplace(kind, std::make_unique<grpc::GenericStub>(channel));
    }
    grpc::Slice slice(job.payload);
    request_ = grpc::ByteBuffer(&slice, 1);
  }

  // Latencies (ns) and errors per window.
  std::vector<std::vector<int64_t>> latencies;
  std::vector<int> errors;

  void run() {
    for (const auto& [kind, target] : job_.targets)
      for (int i = 0; i < 50; ++i) call(kind, target.method);  // warm the connection
    latencies.resize(job_.windows.size());
    errors.assign(job_.windows.size(), 0);
    for (size_t w = 0; w < job_.windows.size(); ++w) {
      const Window& window = job_.windows[w];
      const std::string& method = job_.targets.at(window.kind).method;
      double wait = window.start - wall_now();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      auto end = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(window.end - wall_now()));
      for (auto now = std::chrono::steady_clock::now(); now < end; now = std::chrono::steady_clock::now()) {
        if (!call(window.kind, method)) ++errors[w];
        latencies[w].push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - now).count());
      }
    }
  }

 private:
  bool call(const std::string& kind, const std::string& method) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto rpc = stubs_.at(kind)->PrepareUnaryCall(&context, method, request_, &queue_);
    rpc->StartCall();
    grpc::ByteBuffer response;
    grpc::Status status;
    rpc->Finish(&response, &status, this);
    void* tag;
    bool ok;
    queue_.Next(&tag, &ok);
    return ok && status.ok();
  }

  const Job& job_;
  std::map<std::string, std::unique_ptr<grpc::GenericStub>> stubs_;
  grpc::ByteBuffer request_;
  grpc::CompletionQueue queue_;
};

}  // namespace

int main() {
  Job job = read_job(std::cin);
  if (job.callers < 1 || job.targets.empty() || job.windows.empty()) {
    std::cerr << "loadgen: the job needs callers, a payload, targets and windows\n";
    return 2;
  }
  std::vector<std::unique_ptr<Caller>> callers;
  for (int i = 0; i < job.callers; ++i) callers.push_back(std::make_unique<Caller>(job, i));
  std::vector<std::thread> threads;
  for (auto& caller : callers) threads.emplace_back([&caller] { caller->run(); });
  for (auto& thread : threads) thread.join();
  for (size_t w = 0; w < job.windows.size(); ++w) {
    int errors = 0;
    std::string latencies;
    for (auto& caller : callers) {
      errors += caller->errors[w];
      for (int64_t ns : caller->latencies[w]) latencies += " " + std::to_string(ns);
    }
    std::printf("%s %d%s\n", job.windows[w].kind.c_str(), errors, latencies.c_str());
  }
  return 0;
}
