"""Builds the downpour package: the gRPC and protobuf stubs are generated
from the repository's proto/*.proto with grpcio-tools (a pinned build
requirement, pyproject.toml) into downpour/proto/, never committed.

The .proto files are read from proto/ beside this file (an sdist carries a
copy there) or else from ../proto (a build from the repository, as
`pip install ./python` does). They import each other as "proto/x.proto", so
protoc runs with the folder above proto/ as its include path and writes
proto/x_pb2.py; each generated `from proto import x_pb2` then becomes
`from downpour.proto import x_pb2` (and the classes' module
downpour.proto.x_pb2), so no top-level `proto` package is installed and the
stubs import only each other.
"""
import os
import re
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
# The files the client needs; what they import is followed.
ROOTS = ["coordinator_service.proto", "example.proto"]
IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.M)
FROM_PROTO = re.compile(r"^(\s*)from proto import ", re.M)
# The module the message classes say they are in (pickle imports it).
MODULE_NAME = re.compile(r"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, ')proto\.")


def proto_dir():
    for candidate in (os.path.join(HERE, "proto"), os.path.join(HERE, "..", "proto")):
        if os.path.isfile(os.path.join(candidate, ROOTS[0])):
            return os.path.normpath(candidate)
    raise SystemExit("downpour: no proto/ folder beside python/ nor in the sdist: build from "
                     "the repository (pip install ./python) or from its sdist")


def proto_closure(folder):
    """The roots and every proto/ file they import, transitively."""
    seen, todo = [], list(ROOTS)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        with open(os.path.join(folder, name)) as f:
            for imported in IMPORT.findall(f.read()):
                if not imported.startswith("proto/"):
                    raise SystemExit(f"downpour: proto/{name} imports {imported}, which is "
                                     "outside proto/; teach python/setup.py where it lives")
                todo.append(imported[len("proto/"):])
    return sorted(seen)


def generate(out_dir):
    """Writes the stubs into out_dir (the downpour/proto package folder)."""
    from grpc_tools import protoc  # A build requirement.

    folder = proto_dir()
    names = proto_closure(folder)
    with tempfile.TemporaryDirectory() as tmp:
        # protoc sees the files as proto/NAME, the name they import each other by.
        os.makedirs(os.path.join(tmp, "include", "proto"))
        for name in names:
            shutil.copy(os.path.join(folder, name), os.path.join(tmp, "include", "proto", name))
        gen = os.path.join(tmp, "gen")
        os.makedirs(gen)
        args = ["grpc_tools.protoc", "-I" + os.path.join(tmp, "include"),
                "-I" + protoc_include(), "--python_out=" + gen, "--pyi_out=" + gen,
                "--grpc_python_out=" + gen] + [os.path.join(tmp, "include", "proto", n)
                                               for n in names]
        if protoc.main(args) != 0:
            raise SystemExit("downpour: protoc failed on " + ", ".join(names))
        os.makedirs(out_dir, exist_ok=True)
        for produced in sorted(os.listdir(os.path.join(gen, "proto"))):
            with open(os.path.join(gen, "proto", produced)) as f:
                text = f.read()
            # protoc writes a _grpc module for every file; only services need one.
            if produced.endswith("_pb2_grpc.py") and "class " not in text:
                continue
            with open(os.path.join(out_dir, produced), "w") as f:
                text = FROM_PROTO.sub(r"\1from downpour.proto import ", text)
                f.write(MODULE_NAME.sub(r"\1downpour.proto.", text))


def protoc_include():
    """grpcio-tools' copy of protobuf's well-known types."""
    import grpc_tools

    return os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            target = os.path.join(HERE, "downpour", "proto")
        else:
            target = os.path.join(self.build_lib, "downpour", "proto")
        generate(target)


class SdistWithProtos(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        folder = proto_dir()
        os.makedirs(os.path.join(base_dir, "proto"), exist_ok=True)
        for name in proto_closure(folder):
            shutil.copy(os.path.join(folder, name), os.path.join(base_dir, "proto", name))


setup(cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProtos})
