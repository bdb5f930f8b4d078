"""Build hook: generate the gRPC code for proto/enforcer/v1 into enforcer/v1 (never edited by hand).

Runs on every build, editable installs included; everything else about the package is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def generate_api() -> None:
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    out = ROOT / "enforcer" / "v1"
    out.mkdir(exist_ok=True)
    (out / "__init__.py").write_text('"""Generated from proto/enforcer/v1 by the package build."""\n')
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{ROOT / 'proto'}", f"-I{include}", f"--python_out={ROOT}", f"--pyi_out={ROOT}"]
    args += [f"--grpc_python_out={ROOT}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on " + " ".join(protos))


class BuildWithApi(build_py):
    def run(self) -> None:
        generate_api()
        # Package discovery ran before the code existed when building from a clean sdist.
        if self.packages is not None and "enforcer.v1" not in self.packages:
            self.packages.append("enforcer.v1")
        super().run()


setup(cmdclass={"build_py": BuildWithApi})
