#!/usr/bin/env bash
# Checks the dependency tree with cargo deny against deny.toml: licences, banned crates,
# sources, and the RustSec advisories, offline, from the snapshot of the advisory database
# beside the checkout (../shared/advisory-db; CI and these machines cannot clone it from
# GitHub). Then proves that the advisories check bites: the same configuration must refuse
# hack/advisory-fixture, a crate that depends on smallvec 1.6.0 (RUSTSEC-2021-0003).
#
#   hack/check-dependencies.sh
#
# The snapshot is found at $PGOP_ADVISORY_SNAPSHOT, else ../shared/advisory-db from the
# checkout, else ../shared/advisory-db from the repository this one was cloned from (a clean
# clone elsewhere, as CI makes). It is copied once per snapshot into
# ~/.cache/pgop/advisory-db/advisory-db-3157b0e258782691 (the directory cargo deny derives
# from the default database URL; deny.toml's db-path) as a git repository whose one commit
# carries the snapshot's date. cargo deny itself: hack/install-cargo-deny.sh.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}
deny=$cache/cargo-deny/bin/cargo-deny
# deny.toml: db-path = "~/.cache/pgop/advisory-db"
db_root=$HOME/.cache/pgop/advisory-db
db=$db_root/advisory-db-3157b0e258782691

[ -x "$deny" ] || "$repo/hack/install-cargo-deny.sh"

snapshot=${PGOP_ADVISORY_SNAPSHOT:-}
if [ -z "$snapshot" ]; then
  for candidate in "$repo/../shared/advisory-db" \
    "$(git -C "$repo" remote get-url origin 2>/dev/null || true)/../shared/advisory-db"; do
    if [ -f "$candidate/SNAPSHOT" ]; then
      snapshot=$candidate
      break
    fi
  done
fi
if [ -z "$snapshot" ] || [ ! -f "$snapshot/SNAPSHOT" ]; then
  echo "check-dependencies: no RustSec advisory snapshot (../shared/advisory-db beside the checkout, or PGOP_ADVISORY_SNAPSHOT=DIR): the advisories cannot be checked" >&2
  exit 1
fi
snapshot=$(cd "$snapshot" && pwd)
read -r commit date < "$snapshot/SNAPSHOT"

if [ "$(cat "$db/.pgop-snapshot" 2>/dev/null)" != "$commit $date" ]; then
  echo "check-dependencies: copying the advisory snapshot $commit ($date) into $db"
  rm -rf "$db"
  mkdir -p "$db"
  cp -R "$snapshot/." "$db/"
  (
    cd "$db"
    export GIT_AUTHOR_NAME=pgop GIT_AUTHOR_EMAIL=pgop@localhost GIT_COMMITTER_NAME=pgop \
      GIT_COMMITTER_EMAIL=pgop@localhost GIT_AUTHOR_DATE="${date}T00:00:00Z" \
      GIT_COMMITTER_DATE="${date}T00:00:00Z"
    git init -q -b main
    git add -A
    git commit -q -m "RustSec advisory database at $commit ($date)"
  )
  echo "$commit $date" > "$db/.pgop-snapshot"
fi

echo "check-dependencies: licences, bans, sources, and advisories as of $date (RustSec $commit)"
# cargo deny reads the manifests of every platform's dependencies, which a build on this
# platform never downloads: on a machine with an empty cargo cache, `--offline` alone fails
# ("failed to load source for dependency ..."). Fetch them first (seconds when present).
(cd "$repo" && cargo fetch --locked --quiet)
(cd "$repo" && "$deny" --locked --offline check licenses bans sources advisories)

# The advisories check must refuse a crate that an advisory names.
fixture=$repo/hack/advisory-fixture
(cd "$fixture" && cargo fetch --locked --quiet)
out=$(cd "$fixture" && "$deny" --locked --offline --color never --config "$repo/deny.toml" \
  check advisories 2>&1) && status=0 || status=$?
if [ "$status" -eq 0 ] || ! grep -q "RUSTSEC-2021-0003" <<<"$out"; then
  echo "$out"
  echo "check-dependencies: the advisories check let smallvec 1.6.0 (RUSTSEC-2021-0003) pass: it is not checking" >&2
  exit 1
fi
echo "check-dependencies: the advisories check refuses a vulnerable crate (hack/advisory-fixture: RUSTSEC-2021-0003)"
