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
        loaded_at_import = "pyseccomp" in sys.modules
        seccomp.pyseccomp()
        import pyseccomp
        imported_runs = list(runs)
        maps = [line.split()[-1] for line in open("/proc/self/maps") if "libseccomp" in line]
        print(json.dumps({
            "runs": imported_runs,
            "loaded_at_import": loaded_at_import,
            "restored": ctypes.util.find_library is usual,
            "seccomp": pyseccomp._libseccomp._name,
            "c": pyseccomp._libc._name,
            "usual_seccomp": usual("seccomp"),
            "usual_c": usual("c"),
            "mapped": sorted(set(maps)),
            "works": len(seccomp.compile_filter(seccomp.variants()[0])) > 0,
        }))
        """
    )
    assert found["loaded_at_import"] is False  # only a process that builds a filter loads it
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
        seccomp._SONAMES["seccomp"] = "libadl-enforcer-absent.so.0"
        runs.clear()
        module = seccomp.pyseccomp()
        usual = ctypes.util.find_library("seccomp")
        print(json.dumps({"runs": len(runs), "seccomp": module._libseccomp._name, "usual": usual}))
        """
    )
    assert found["runs"] >= 1  # the usual lookup ran
    assert found["seccomp"] == found["usual"]


def test_concurrent_first_uses_leave_the_usual_lookup_in_place() -> None:
    """Two threads loading pyseccomp at once: the one that replaces find_library second must not
    save the first one's replacement as the usual lookup and restore it when it is done."""
    found = _fresh(
        """
        import ctypes.util, importlib, json, threading
        from enforcer.sandbox import seccomp
        usual = ctypes.util.find_library
        second_in, first_done = threading.Event(), threading.Event()
        calls = []

        class Slow:
            @staticmethod
            def import_module(name):
                calls.append(name)
                if len(calls) == 1:
                    second_in.wait(2)  # the first import, while the second thread enters
                else:
                    second_in.set()
                    first_done.wait(2)
                return importlib.import_module(name)

        seccomp.importlib = Slow
        first = threading.Thread(target=seccomp.pyseccomp)
        second = threading.Thread(target=seccomp.pyseccomp)
        first.start()
        while not calls:
            pass
        second.start()
        first.join()
        first_done.set()
        second.join()
        print(json.dumps({"restored": ctypes.util.find_library is usual, "calls": len(calls)}))
        """
    )
    assert found["calls"] == 2
    assert found["restored"] is True
