// The transport-security flags every daemon shares (--tls_cert, --tls_key,
// --tls_ca, --tls_reload_s, --insecure, --metrics_tls), defined once and read once, in
// main, into SecurityOptions.
#ifndef DOWNPOUR_RPC_SECURITY_FLAGS_H_
#define DOWNPOUR_RPC_SECURITY_FLAGS_H_

#include "rpc/security.h"

namespace downpour {

SecurityOptions SecurityOptionsFromFlags();

}  // namespace downpour

#endif  // DOWNPOUR_RPC_SECURITY_FLAGS_H_
