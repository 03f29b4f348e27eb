#!/usr/bin/env bash
# Makes a development CA and certificates for a Downpour cluster with
# openssl, and the coordinator's --auth_config for its operators.
#
#   scripts/make-certs.sh DIR ENTRY...
#
# ENTRY is one of
#   coordinator[:HOST,...]   the coordinator's server certificate
#   node:ID[:HOST,...]       a shard's or worker's certificate; ID is its
#                            --node_id (its identity: spiffe://downpour/node/ID)
#   user:NAME:ROLE           an operator (ROLE admin or viewer): a client
#                            certificate (spiffe://downpour/user/NAME), a
#                            bearer token in DIR/NAME.token, and an entry in
#                            DIR/auth.pbtxt that names both
# Every server certificate also names localhost and 127.0.0.1; HOST entries
# that are IPv4 addresses become IP names, the rest DNS names. The CA
# (DIR/ca.crt, DIR/ca.key) is made once and reused; other files are
# replaced. Keys are P-256, certificates valid for 365 days (DAYS=...).
#
# Example (the README's multi-host walk-through):
#   scripts/make-certs.sh certs coordinator:coord.example.org \
#     node:ps0:ps0.example.org node:worker0:gpu0.example.org user:alice:admin
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
command -v openssl >/dev/null || { echo "make-certs: openssl is not installed" >&2; exit 1; }
dir=$1
shift
days=${DAYS:-365}
mkdir -p "$dir"
umask 077

if [[ ! -s $dir/ca.key || ! -s $dir/ca.crt ]]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/ca.key"
  openssl req -x509 -new -key "$dir/ca.key" -sha256 -days "$days" -subj "/CN=Downpour development CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$dir/ca.crt" 2>/dev/null
fi

# issue NAME CN SAN EXTENDED_KEY_USAGE
issue() {
  local name=$1 cn=$2 san=$3 eku=$4
  # New files beside the old ones, then renamed over them: a daemon watching
  # them never reads half a file.
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/$name.key.tmp"
  openssl pkcs8 -topk8 -nocrypt -in "$dir/$name.key.tmp" -out "$dir/$name.key.new"
  rm -f "$dir/$name.key.tmp"
  openssl req -new -key "$dir/$name.key.new" -subj "/CN=$cn" -out "$dir/$name.csr"
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' \
    "$san" "$eku" >"$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -sha256 -extfile "$dir/$name.ext" -out "$dir/$name.crt.new" 2>/dev/null
  rm -f "$dir/$name.csr" "$dir/$name.ext"
  chmod 644 "$dir/$name.crt.new"
  mv "$dir/$name.key.new" "$dir/$name.key"
  mv "$dir/$name.crt.new" "$dir/$name.crt"
}

# host_names HOST,... : the SAN entries of a server.
host_names() {
  local names="DNS:localhost,IP:127.0.0.1" host
  IFS=, read -ra hosts <<<"${1:-}"
  for host in "${hosts[@]}"; do
    [[ -z $host ]] && continue
    if [[ $host =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then names+=",IP:$host"; else names+=",DNS:$host"; fi
  done
  echo "$names"
}

auth="$dir/auth.pbtxt"
for entry in "$@"; do
  IFS=: read -r kind name rest <<<"$entry"
  case $kind in
    coordinator)
      issue coordinator "downpour-coordinator" "URI:spiffe://downpour/coordinator,$(host_names "$name")" \
        serverAuth,clientAuth
      ;;
    node)
      [[ -n $name ]] || { echo "make-certs: node:ID needs an ID" >&2; exit 2; }
      issue "$name" "$name" "URI:spiffe://downpour/node/$name,$(host_names "$rest")" serverAuth,clientAuth
      ;;
    user)
      case $rest in
        admin) role=ADMIN ;;
        viewer) role=VIEWER ;;
        *) echo "make-certs: $entry: the role is admin or viewer" >&2; exit 2 ;;
      esac
      issue "$name" "$name" "URI:spiffe://downpour/user/$name" clientAuth
      openssl rand -hex 32 >"$dir/$name.token"
      hash=$(tr -d '\n' <"$dir/$name.token" | openssl dgst -sha256 -r | cut -d' ' -f1)
      touch "$auth"
      # Replace the principal's entry if there is one.
      grep -v "name: \"$name\" " "$auth" >"$auth.tmp" || true
      printf 'principal { name: "%s" role: %s token_sha256: "%s" certificate_uri: "spiffe://downpour/user/%s" }\n' \
        "$name" "$role" "$hash" "$name" >>"$auth.tmp"
      mv "$auth.tmp" "$auth"
      chmod 644 "$auth"
      ;;
    *)
      echo "make-certs: unknown entry '$entry' (coordinator[:HOSTS], node:ID[:HOSTS], user:NAME:ROLE)" >&2
      exit 2
      ;;
  esac
done
chmod 644 "$dir/ca.crt"
echo "make-certs: certificates in $dir" >&2
