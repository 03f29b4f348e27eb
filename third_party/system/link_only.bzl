"""cc_link_only: a library whose dependents compile against its interface only.

Bazel 4.2.3 has no implementation_deps: everything a cc_library depends on,
headers and include paths, reaches the compile actions of every library above
it. kernels:factory depends on the CUDA toolkit's headers, so without a cut
every compile action above kernels/ would hold them as inputs and differ
between a CUDA build and a CPU-only one, and the CPU-only build would rebuild
the whole tree. This rule gives its dependents the compilation context of
`interface` (headers that name no CUDA type) and the linking context of
`implementation` (which depends on `interface` and on whatever it needs).
"""

def _cc_link_only_impl(ctx):
    return [CcInfo(
        compilation_context = ctx.attr.interface[CcInfo].compilation_context,
        linking_context = ctx.attr.implementation[CcInfo].linking_context,
    )]

cc_link_only = rule(
    implementation = _cc_link_only_impl,
    attrs = {
        "interface": attr.label(mandatory = True, providers = [CcInfo]),
        "implementation": attr.label(mandatory = True, providers = [CcInfo]),
    },
    doc = "Compile against `interface`, link `implementation`.",
)
