"""Compiles .proto files with the system protoc and gRPC plugin."""

load("@rules_cc//cc:defs.bzl", "cc_library")

def _gen(name, src, deps, grpc):
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) "
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        cmd += "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin --grpc_out=$(GENDIR) "
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = cmd + "$(location " + src + ")",
    )
    native.filegroup(name = name + "_srcs", srcs = [src] + [d + "_srcs" for d in deps])
    cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpc" if grpc else "@system//:protobuf"],
    )

def cc_proto(name, src, deps = []):
    _gen(name, src, deps, grpc = False)

def cc_grpc_library(name, src, deps = []):
    _gen(name, src, deps, grpc = True)
