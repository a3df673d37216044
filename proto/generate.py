"""Regenerate the Python gRPC code in memory_proto/ from proto/memory/v1/*.proto.

Usage: python proto/generate.py [--out DIR]

The generated modules import each other relatively, so memory_proto is an ordinary package.
A test regenerates into a temporary folder and fails when the committed code is stale.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
DEFAULT_OUT = PROTO_ROOT.parent / "memory_proto"
_ABSOLUTE_IMPORT = re.compile(r"^from memory\.v1 import (\w+)", re.MULTILINE)


def generate(out: Path) -> list[Path]:
    """Write the generated modules into `out` and return their paths."""
    protos = sorted(PROTO_ROOT.glob("memory/v1/*.proto"))
    grpc_include = Path(protoc.__file__).resolve().parent / "_proto"
    bin_dir = Path(sys.executable).parent  # mypy-protobuf's plugins live beside the interpreter
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{grpc_include}",
            f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *(str(p.relative_to(PROTO_ROOT)) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / "memory" / "v1").iterdir()):
            text = _ABSOLUTE_IMPORT.sub(r"from . import \1", src.read_text())
            dest = out / src.name
            dest.write_text(text)
            written.append(dest)
        init = out / "__init__.py"
        init.write_text('"""Generated gRPC code for proto/memory/v1; run proto/generate.py."""\n')
        written.append(init)
        (out / "py.typed").write_text("")
        written.append(out / "py.typed")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output package folder")
    args = parser.parse_args()
    if args.out == DEFAULT_OUT and DEFAULT_OUT.exists():
        shutil.rmtree(DEFAULT_OUT)
    for path in generate(args.out):
        print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
