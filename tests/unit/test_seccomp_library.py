"""pyseccomp is imported without running `ldconfig -p`, and loads the libraries the usual lookup names."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _fresh(code: str) -> dict[str, object]:
    """Run `code` in a new interpreter (pyseccomp loads its libraries once per process) and return
    the JSON it prints."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_import_runs_no_process_and_loads_the_libraries_the_usual_lookup_names() -> None:
    found = _fresh(
        """
        import ctypes.util, json, sys
        runs = []
        sys.addaudithook(lambda event, args: runs.append(str(args[1])) if event == "subprocess.Popen" else None)
        usual = ctypes.util.find_library
        from enforcer.sandbox import seccomp
        import pyseccomp
        imported_runs = list(runs)
        maps = [line.split()[-1] for line in open("/proc/self/maps") if "libseccomp" in line]
        print(json.dumps({
            "runs": imported_runs,
            "restored": ctypes.util.find_library is usual,
            "seccomp": pyseccomp._libseccomp._name,
            "c": pyseccomp._libc._name,
            "usual_seccomp": usual("seccomp"),
            "usual_c": usual("c"),
            "mapped": sorted(set(maps)),
            "works": seccomp.sc.resolve_syscall(seccomp.sc.Arch.NATIVE, "getpid") > 0,
        }))
        """
    )
    assert found["runs"] == []
    assert found["restored"] is True
    assert found["seccomp"] == found["usual_seccomp"]
    assert found["c"] == found["usual_c"]
    assert len(found["mapped"]) == 1  # one libseccomp in the process: the one the soname names
    assert found["works"] is True


def test_a_soname_the_loader_cannot_open_takes_the_usual_lookup() -> None:
    found = _fresh(
        """
        import ctypes.util, json, sys
        runs = []
        sys.addaudithook(lambda event, args: runs.append(str(args[1])) if event == "subprocess.Popen" else None)
        from enforcer.sandbox import seccomp
        del sys.modules["pyseccomp"]
        seccomp._SONAMES["seccomp"] = "libadl-enforcer-absent.so.0"
        runs.clear()
        module = seccomp._import_pyseccomp()
        usual = ctypes.util.find_library("seccomp")
        print(json.dumps({"runs": len(runs), "seccomp": module._libseccomp._name, "usual": usual}))
        """
    )
    assert found["runs"] >= 1  # the usual lookup ran
    assert found["seccomp"] == found["usual"]
