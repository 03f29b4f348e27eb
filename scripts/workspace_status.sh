#!/usr/bin/env bash
# Bazel's --workspace_status_command (.bazelrc): the commit the binaries are
# built from, for downpour_build_info. STABLE_ keys rebuild what reads them
# when they change (only common:build_info's stamp does). Never fails: a
# tree without git says "unknown".
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || commit=unknown
echo "STABLE_DOWNPOUR_COMMIT ${commit:-unknown}"
