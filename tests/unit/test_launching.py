"""The launch path embedded adl-exec and the daemon share (enforcer/launching.py), up to the point
where an agent would start: every refusal is audited with its reason, explain runs nothing and
records nothing, TerminateSession before the start ends it as terminated, the daemon's masks land
in the plan. No session is run here (tests/integration runs them)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from enforcer import launching
from enforcer.audit import AuditUnavailable, AuditWriter
from enforcer.audit.query import iter_records
from enforcer.sandbox.identity import ROOT_REFUSAL, Identity
from enforcer.sandbox.plan import HostFeatures, LaunchPlan, PlanError, load_baseline

from ..helpers.documents import base_adl, compile_doc

REPO = Path(__file__).resolve().parents[2]
AGENT_ID = "did:web:agents.example:launching"
AGENT = Identity(54321, 54321, "test")  # an unprivileged account: nothing here switches to it


@dataclass(frozen=True)
class Compiled:
    """A policy source that hands over a policy compiled by the test, or raises what it is given."""

    compiled: launching.CompiledPolicy | None
    error: Exception | None = None

    def load(self, features: HostFeatures) -> launching.CompiledPolicy:
        if self.error is not None:
            raise self.error
        assert self.compiled is not None
        return self.compiled


class Watcher:
    def __init__(self, refuse_with: str | None = None) -> None:
        self.warnings: list[str] = []
        self.plans: list[LaunchPlan] = []
        self.refuse_with = refuse_with

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def planned(self, compiled: launching.CompiledPolicy, plan: LaunchPlan) -> None:
        self.plans.append(plan)
        if self.refuse_with:
            raise PlanError(self.refuse_with)

    def ended(self, audit_dir: Path) -> dict[str, Any] | None:
        raise AssertionError("no session runs in these tests")


@pytest.fixture(scope="module")
def compiled(schemas: Any) -> launching.CompiledPolicy:
    adl = base_adl(id=AGENT_ID)
    policy = compile_doc(schemas, adl)
    return launching.CompiledPolicy(policy, load_baseline(REPO / "policies" / "runtime-baseline.yaml"), adl)


class Log:
    """A real audit log in tmp_path, opened as the launch path opens it."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.opened = directory, 0

    def open(self) -> AuditWriter:
        self.opened += 1
        return AuditWriter(self.directory / "log", self.directory / "key.pem", source="test")

    def records(self, kind: str) -> list[dict[str, Any]]:
        return [r["payload"] for r in iter_records(self.directory / "log") if r.get("intent") == f"adl.enforcer.{kind}"]


def request(source: Any, **changes: Any) -> launching.LaunchRequest:
    members: dict[str, Any] = {
        "session": "s-launching",
        "argv": ("/bin/true", "--flag"),
        "environ": {"PATH": "/usr/bin:/bin"},
        "policy": source,
        "user": AGENT,
    }
    members.update(changes)
    return launching.LaunchRequest(**members)


def test_a_policy_that_cannot_be_loaded_is_refused_and_audited(tmp_path: Path) -> None:
    log = Log(tmp_path)
    source = Compiled(None, PlanError("documents unreadable"))
    result = launching.launch(request(source, caller_uid=1000, cwd="/home/a"), log.open)
    assert result == launching.Refused("documents unreadable")
    (refused,) = log.records("refused")
    assert refused["refusal"] == "documents unreadable" and refused["decision"] == "deny"
    assert "agent" not in refused  # no policy to name
    assert (refused["caller_uid"], refused["cwd"]) == (1000, "/home/a")  # the daemon's caller


def test_a_policy_that_changed_while_launching_is_refused(tmp_path: Path, compiled: Any) -> None:
    log = Log(tmp_path)
    result = launching.launch(request(Compiled(compiled), policy_digest="sha256:" + "0" * 64), log.open)
    assert isinstance(result, launching.Refused)
    assert "changed while it was being launched" in result.reason
    (refused,) = log.records("refused")
    assert (refused["agent"], refused["policy_digest"]) == (AGENT_ID, compiled.policy.digest)


def test_the_agent_never_runs_as_root(tmp_path: Path, compiled: Any) -> None:
    log = Log(tmp_path)
    result = launching.launch(request(Compiled(compiled), user="0:0"), log.open)
    assert isinstance(result, launching.Refused) and ROOT_REFUSAL in result.reason
    assert [r["refusal"] for r in log.records("refused")] == [result.reason]
    assert not log.records("launch")


def test_no_audit_log_no_launch(tmp_path: Path, compiled: Any) -> None:
    def unavailable() -> AuditWriter:
        raise AuditUnavailable("disk full")

    watcher = Watcher()
    result = launching.launch(request(Compiled(compiled)), unavailable, observer=watcher)
    assert result == launching.Refused("audit log unavailable, nothing runs unrecorded: disk full")
    assert not watcher.plans  # refused before anything was planned


def test_a_refusal_the_log_cannot_take_says_so(tmp_path: Path) -> None:
    class Failing:
        directory = tmp_path

        def append(self, *args: Any, **kw: Any) -> Any:
            raise AuditUnavailable("write failed")

        def close(self) -> None:
            pass

    result = launching.launch(request(Compiled(None, PlanError("no"))), lambda: Failing())  # type: ignore[arg-type,return-value]
    assert result == launching.Refused("no", "refusal not audited: write failed")


def test_explain_plans_and_records_nothing(tmp_path: Path, compiled: Any) -> None:
    log, watcher = Log(tmp_path), Watcher()
    result = launching.launch(
        request(Compiled(compiled), explain_only=True, accept_unenforced=frozenset({"network"})),
        log.open,
        observer=watcher,
    )
    assert isinstance(result, launching.Explained)
    assert result.policy is compiled.policy and result.plan is watcher.plans[0]
    assert result.plan.argv == ["/bin/true", "--flag"]
    assert log.opened == 0
    assert not watcher.warnings  # the unenforced warning is for launches only


def test_the_daemons_masks_land_in_the_plan(tmp_path: Path, compiled: Any) -> None:
    audit_dir, key = tmp_path / "audit", tmp_path / "audit.key"
    audit_dir.mkdir()
    key.write_text("key")
    masks = launching.Masks((audit_dir, tmp_path / "absent"), (key, tmp_path / "absent.key"), "daemon_files", "why")
    result = launching.launch(request(Compiled(compiled), explain_only=True, masks=masks), Log(tmp_path).open)
    assert isinstance(result, launching.Explained)
    assert str(audit_dir) in result.plan.dir_masks and str(key) in result.plan.file_masks
    assert str(tmp_path / "absent") not in result.plan.dir_masks  # only what exists is masked
    assert str(tmp_path / "absent.key") not in result.plan.file_masks
    layer = next(layer for layer in result.plan.layers if layer.name == "daemon_files")
    assert layer.details == ["why"] and layer.status == "active"


def test_what_the_caller_adds_can_refuse(tmp_path: Path, compiled: Any) -> None:
    log = Log(tmp_path)
    result = launching.launch(request(Compiled(compiled)), log.open, observer=Watcher(refuse_with="--learn refused"))
    assert isinstance(result, launching.Refused) and result.reason == "--learn refused"
    assert [r["agent"] for r in log.records("refused")] == [AGENT_ID]


def test_terminated_before_the_agent_started(tmp_path: Path, compiled: Any) -> None:
    log, watcher = Log(tmp_path), Watcher()
    steps: list[str] = []
    result = launching.launch(
        request(Compiled(compiled), accept_unenforced=frozenset({"network"})),
        log.open,
        terminated=lambda: True,
        before_fork=lambda: steps.append("before fork"),
        observer=watcher,
    )
    assert result == launching.Terminated("before the agent started")
    assert steps == ["before fork"]
    # Said for each domain that stays unenforced on this host, before the agent would start.
    unenforced = watcher.plans[0].accepted_unenforced
    assert watcher.warnings == [f"'{d}' is NOT enforced (accepted with --accept-unenforced)" for d in unenforced]
    (refused,) = log.records("refused")
    assert refused["refusal"] == "terminated by TerminateSession before the agent started"
    assert not log.records("launch")  # nothing ran


def test_the_helpers_join_is_awaited_after_the_launch_record_and_its_failure_refuses(
    tmp_path: Path, compiled: Any
) -> None:
    """The daemon's supervisor moves into its helpers' cgroup on a thread; the launch waits for it
    only before it would fork or start the agent, and a move that failed starts nothing."""
    log = Log(tmp_path)
    seen: list[int] = []
    reason = "the session's helpers cannot join their cgroup, nothing runs unaccounted: EBUSY"

    def join_failed() -> None:
        seen.append(len(log.records("launch")))
        raise OSError(reason)

    result = launching.launch(
        request(Compiled(compiled), session=f"s-join-{os.getpid()}"),
        log.open,
        before_fork=join_failed,
        terminated=lambda: False,
    )
    assert result == launching.Refused(reason)
    assert seen == [1]  # once, with the launch record written
    assert [r["refusal"] for r in log.records("refused")] == [reason]


def test_the_result_is_reported_once_recorded_and_before_the_writer_closes(tmp_path: Path, compiled: Any) -> None:
    """The daemon's supervisor sends SessionEnded from `report`: the records are durable by then,
    and the writer's close (its checkpoint) does not delay it."""
    opened: list[AuditWriter] = []
    seen: list[tuple[Any, list[str], bool]] = []

    def open_log() -> AuditWriter:
        opened.append(Log(tmp_path).open())
        return opened[-1]

    def report(result: Any) -> None:
        writer = opened[0]
        written = [r["intent"] for r in iter_records(tmp_path / "log")]
        seen.append((result, written, writer.durable_seq == max(r["seq"] for r in iter_records(tmp_path / "log"))))

    result = launching.launch(request(Compiled(compiled), user="0:0"), open_log, report=report)
    ((reported, written, durable),) = seen
    assert reported is result and isinstance(result, launching.Refused) and durable
    assert written[-1] == "adl.enforcer.refused"  # not yet the writer's close and checkpoint
    assert [r["intent"] for r in iter_records(tmp_path / "log")][len(written) :]  # written after it


# -- the compiled policies PolicyDocuments remembers (the daemon's spawner compiles ahead) ------


@pytest.fixture
def documents(tmp_path: Path, schemas: Any) -> launching.PolicyDocuments:
    regions, baseline = tmp_path / "regions.yaml", tmp_path / "baseline.yaml"
    regions.write_bytes((REPO / "policies" / "regions.yaml").read_bytes())
    baseline.write_bytes((REPO / "policies" / "runtime-baseline.yaml").read_bytes())
    return launching.PolicyDocuments(
        adl=base_adl(id=AGENT_ID),
        aaif=None,
        regions=regions,
        baseline=baseline,
        production=False,
        home_region=None,
        spec_dir=schemas.root,
    )


def test_the_same_documents_and_settings_are_compiled_once(documents: launching.PolicyDocuments) -> None:
    first = documents.load()
    again = launching.PolicyDocuments(**{**vars(documents), "adl": base_adl(id=AGENT_ID)})  # equal, not the same
    assert again.load() is first
    assert first.policy.agent_id == AGENT_ID


@pytest.mark.parametrize(
    "change",
    ["adl", "aaif", "regions bytes", "regions path", "baseline bytes", "production", "home_region", "spec_dir"],
)
def test_a_changed_document_or_setting_is_compiled_again(
    documents: launching.PolicyDocuments, tmp_path: Path, change: str
) -> None:
    first = documents.load()
    changed = dict(vars(documents))
    if change == "adl":
        changed["adl"] = base_adl(id=AGENT_ID, description="another")
    elif change == "aaif":
        changed["adl"] = base_adl(id=AGENT_ID, name="Fast")
        changed["aaif"] = {
            "sc_standard": "SC-006",
            "sc_version": "3.2.0",
            "agent_id": "a1c0ffee-0000-4000-8000-00000000fa57",
            "status": "active",
            "agent": {"name": "Fast", "goal": "remembered policies"},
        }
        first = launching.PolicyDocuments(**changed).load()  # compared with another AAIF document below
        changed["aaif"] = {**changed["aaif"], "agent": {"name": "Fast", "goal": "another goal"}}
    elif change == "regions bytes":
        documents.regions.write_bytes(documents.regions.read_bytes() + b"\n# edited\n")
    elif change == "regions path":
        moved = tmp_path / "regions-copy.yaml"
        moved.write_bytes(documents.regions.read_bytes())
        changed["regions"] = moved
    elif change == "baseline bytes":
        documents.baseline.write_bytes(documents.baseline.read_bytes() + b"\n# edited\n")
    elif change == "production":
        changed["production"] = True
    elif change == "home_region":
        changed["home_region"] = "eu"
    else:
        changed["spec_dir"] = None if documents.spec_dir is not None else REPO / "enforcer" / "data" / "schemas"
    again = launching.PolicyDocuments(**changed).load()
    assert again is not first
    if change == "adl":
        assert again.policy.digest != first.policy.digest
    if change == "baseline bytes":
        assert again.baseline.digest != first.baseline.digest


def test_a_remembered_policy_is_used_only_until_the_time_changes_what_it_compiles_to(
    documents: launching.PolicyDocuments,
) -> None:
    from datetime import UTC, datetime, timedelta

    from enforcer.policy.adl import NEAR_EXPIRY

    # Its sunset enters the warning window a second from now: compiled after that, it warns.
    sunset = datetime.now(UTC) + NEAR_EXPIRY + timedelta(seconds=1.5)
    lifecycle = {"status": "active", "sunset_date": sunset.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    expiring = launching.PolicyDocuments(**{**vars(documents), "adl": base_adl(id=AGENT_ID, lifecycle=lifecycle)})
    first = expiring.load()
    assert expiring.load() is first
    time.sleep(max(0.0, (sunset - NEAR_EXPIRY - datetime.now(UTC)).total_seconds()) + 0.05)
    later = expiring.load()
    assert later is not first
    assert len(later.policy.warnings) > len(first.policy.warnings)


def test_the_documents_are_compiled_from_the_bytes_they_are_remembered_by(
    documents: launching.PolicyDocuments,
) -> None:
    documents.baseline.write_bytes(b"read: [relative/path]\n")  # what the compilation refuses
    with pytest.raises(PlanError):
        documents.load()
    with pytest.raises(PlanError):  # a refusal is not remembered: the next load meets it again
        documents.load()
