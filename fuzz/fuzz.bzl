"""fuzz_test: one libFuzzer target that is also a replay test of its corpus.

Built with --config=fuzz (clang, see .bazelrc), the test is a libFuzzer
binary: scripts/fuzz.sh runs it for a while over a copy of its corpus, and
`bazel test` runs it with -runs=0, which executes the seed corpus once under
ASan and UBSan; DOWNPOUR_LIBFUZZER is defined then, for code that calls into
libFuzzer (a custom mutator). Built without it (gcc, the main build),
fuzz_main.cc replays the seed corpus through LLVMFuzzerTestOneInput, so
`bazel test //...` keeps every seed (and every crash input kept as a seed)
passing.
"""

load("@rules_cc//cc:defs.bzl", "cc_test")

def fuzz_test(name, srcs, deps, corpus, dict = None):
    """A libFuzzer target `name` over the seed corpus in directory `corpus`.

    Args:
      name: the target, e.g. "job_spec_fuzzer".
      srcs: sources defining LLVMFuzzerTestOneInput.
      deps: what they need.
      corpus: the seed corpus directory, relative to this package.
      dict: an optional libFuzzer dictionary file.
    """
    cc_test(
        name = name,
        size = "small",
        srcs = srcs,
        args = ["-runs=0", native.package_name() + "/" + corpus],
        data = native.glob([corpus + "/**"]) + ([dict] if dict else []),
        local_defines = select({
            ":libfuzzer": ["DOWNPOUR_LIBFUZZER"],
            "//conditions:default": [],
        }),
        linkopts = select({
            ":libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            ":libfuzzer": [],
            "//conditions:default": [":fuzz_main"],
        }),
    )
