#!/bin/sh
# libtpuclient's messages are built and read in one room: client/src/rpc/.
# The rooms above it hand rpc plain C and get plain C back, so a change of
# the wire touches rpc only. Fails naming each line of client/src outside
# rpc/ that names a protobuf type, constant or function (Tpuemu__*,
# TPUEMU__*, tpuemu__*, TensorFlow's) or includes a protobuf-c header.
# usage: wire_rooms.sh SOURCE_DIR
set -eu
src=${1:?usage: wire_rooms.sh SOURCE_DIR}
hits=$(grep -rnE '\b(Tpuemu__|TPUEMU__|tpuemu__|Tensorflow__|TENSORFLOW__|tensorflow__)|pb-c\.h' \
    "$src/client/src" --include='*.c' --include='*.h' | grep -v "^$src/client/src/rpc/" || true)
if [ -n "$hits" ]; then
    echo "protobuf outside client/src/rpc/ (give rpc a function that takes and returns plain C):" >&2
    echo "$hits" >&2
    exit 1
fi
echo "no file of client/src outside rpc/ names a protobuf type or includes a protobuf-c header"
