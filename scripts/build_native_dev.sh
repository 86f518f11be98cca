#!/bin/sh
# Development build of the native core (issue #25) into this tree, until the
# packaging (setuptools-rust) builds it: sniffer/_native.abi3.so (git-ignored).
set -eu
cd "$(dirname "$0")/.."
(cd native && cargo build --release -p sparseety-native)
# copied then renamed: a running interpreter that mapped the old file keeps it
cp native/target/release/lib_native.so sniffer/_native.abi3.so.tmp
mv sniffer/_native.abi3.so.tmp sniffer/_native.abi3.so
echo "built sniffer/_native.abi3.so"
