#!/bin/bash
# A ledger directory shared by a group (chmod 2770, the documented set-up for a lab box) serves
# every member: two unprivileged users of one group, each with umask 022, both reserve and both
# read `gpu status`, whoever created the lock and data files. (Before the fix the lock file took
# its mode from the umask, 0640, and the second user got "Permission denied".)
set -u
. "$TANDEM_SOURCE_DIR/tests/lib/common.sh"

if [ "$(id -u)" != 0 ]; then
    echo "skipped: creating two test users and a group needs root (running as uid $(id -u))"
    exit 77
fi
for tool in useradd groupadd userdel groupdel setpriv; do
    command -v $tool >/dev/null || { echo "skipped: $tool is not installed"; exit 77; }
done

suffix=$$
group=tdmg$suffix
users="tdma$suffix tdmb$suffix"
cleanup_users() {
    for u in $users; do userdel "$u" >/dev/null 2>&1; done
    groupdel "$group" >/dev/null 2>&1
    [ -n "${pub:-}" ] && rm -rf "$pub"
    cleanup_work
}
trap cleanup_users EXIT
groupadd "$group" || { echo "skipped: groupadd failed"; exit 77; }
for u in $users; do
    useradd -M -N -g "$group" -s /bin/sh "$u" || { echo "skipped: useradd failed"; exit 77; }
done

# Everything the users run or touch lives under a directory they can enter ($WORK may be under a
# 0700 checkout or home directory): the binary and the shared ledger directory.
pub=$(mktemp -d /tmp/tandem-shared-XXXXXX)
chmod 0755 "$pub"
cp "$TANDEM" "$pub/tandem" && chmod 0755 "$pub/tandem"
shared="$pub/ledger"
mkdir "$shared" && chgrp "$group" "$shared" && chmod 2770 "$shared"

# as USER CMD...: runs CMD as USER (primary group $group, umask 022), output in $WORK/TAG.out/err
# where TAG is $tag when set, else USER.
as() {
    local user=$1; shift
    setpriv --reuid="$user" --regid="$group" --init-groups \
        env HOME=/tmp TANDEM_LEDGER_DIR="$shared" sh -c 'umask 022; exec "$@"' sh "$@" \
        >"$WORK/${tag:-$user}.out" 2>"$WORK/${tag:-$user}.err"
}
set -- $users
a=$1 b=$2

as "$a" "$pub/tandem" gpu run --vram 1 --task first -- true ||
    fail "first user could not reserve: $(cat "$WORK/$a.err")"
for f in gpu-ledger.lock gpu-ledger.json; do
    [ -e "$shared/$f" ] || { fail "$f was not created"; continue; }
    mode=$(stat -c %a "$shared/$f")
    [ "$mode" = 660 ] || fail "$f has mode $mode, not 660 (group members could not use it)"
    [ "$(stat -c %G "$shared/$f")" = "$group" ] || fail "$f is not in group $group"
done

# The second user reserves while the first holds a reservation, and both see both in status.
tag=holder-a as "$a" "$pub/tandem" gpu run --vram 2 --task held-by-a -- sleep 20 &
holder=$!
wait_until 10 sh -c "jq -e '.reservations | length == 1' '$shared/gpu-ledger.json'"
as "$b" "$pub/tandem" gpu run --vram 1 --task second -- true ||
    fail "second user could not reserve: $(cat "$WORK/$b.err")"
as "$b" "$pub/tandem" gpu status --json || fail "second user's gpu status: $(cat "$WORK/$b.err")"
jq -e '.gpus[0].reservations[] | select(.task == "held-by-a")' "$WORK/$b.out" >/dev/null ||
    fail "second user does not see the first user's reservation: $(cat "$WORK/$b.out")"
tag=holder-b as "$b" "$pub/tandem" gpu run --vram 2 --task held-by-b -- sleep 20 &
holder_b=$!
wait_until 10 sh -c "jq -e '.reservations | length == 2' '$shared/gpu-ledger.json'"
as "$a" "$pub/tandem" gpu status --json || fail "first user's gpu status: $(cat "$WORK/$a.err")"
[ "$(jq '.gpus[0].reservations | length' "$WORK/$a.out" 2>/dev/null)" = 2 ] ||
    fail "first user does not see both reservations: $(cat "$WORK/$a.out")"
kill $holder $holder_b 2>/dev/null
wait $holder $holder_b 2>/dev/null

# A lock file an older tandem created too narrow (0640) is widened by its owner's next use.
chmod 0640 "$shared/gpu-ledger.lock"
owner=$(stat -c %U "$shared/gpu-ledger.lock")
as "$owner" "$pub/tandem" gpu status || fail "owner's gpu status: $(cat "$WORK/$owner.err")"
[ "$(stat -c %a "$shared/gpu-ledger.lock")" = 660 ] || fail "the owner did not widen the lock file"
finish
