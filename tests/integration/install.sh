# The install rules (make install PREFIX=..., cmake --install): into an empty temporary prefix,
# the binary lands in bin/ and runs from there (--version, a subcommand's --help), the docs land
# in share/doc/tandem; nothing else is needed from the build tree.
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"
prefix="$WORK/prefix"
cmake --install "$TANDEM_BINARY_DIR" --prefix "$prefix" >"$WORK/install.log" 2>&1 ||
    { fail "cmake --install failed"; cat "$WORK/install.log" >&2; }
[ -x "$prefix/bin/tandem" ] || fail "no executable $prefix/bin/tandem"
want="tandem $(sed -n 's/^project(tandem VERSION \([0-9.]*\).*/\1/p' "$TANDEM_SOURCE_DIR/CMakeLists.txt")"
got=$(cd / && PATH="$prefix/bin:/usr/bin:/bin" tandem --version | head -n 1) # line 2: features
[ "$got" = "$want" ] || fail "installed tandem --version: '$got', want '$want'"
(cd / && PATH="$prefix/bin:/usr/bin:/bin" tandem generate --help) | grep -q "usage: tandem generate" ||
    fail "installed tandem generate --help"
for f in README.md engine.md generate.md gpu-sharing.md; do
    [ -f "$prefix/share/doc/tandem/$f" ] || fail "no $prefix/share/doc/tandem/$f"
done
finish
