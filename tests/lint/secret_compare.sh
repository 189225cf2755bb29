#!/bin/sh
# Secrets are compared in constant time: a MAC, token, challenge or key is
# checked with auth_mac_ok / auth_challenge_mac_ok (libsodium's verify or
# sodium_memcmp), never with memcmp/strcmp/strncmp, whose early exit tells a
# stranger how many leading bytes of a guess were right. Fails naming each
# line that compares one of them with a plain compare.
# usage: secret_compare.sh SOURCE_DIR
set -eu
src=${1:?usage: secret_compare.sh SOURCE_DIR}
hits=$(grep -rnE '\b(memcmp|strcmp|strncmp|bcmp)[[:space:]]*\([^;]*(mac|MAC|token|TOKEN|chal|key)\b' \
    "$src/common" "$src/server" "$src/client" --include='*.c' --include='*.h' || true)
if [ -n "$hits" ]; then
    echo "secrets compared with a plain (early-exit) compare; use auth_mac_ok/auth_challenge_mac_ok/sodium_memcmp:" >&2
    echo "$hits" >&2
    exit 1
fi
echo "no MAC, token, challenge or key is compared with memcmp/strcmp"
