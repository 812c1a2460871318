#!/usr/bin/env bash
# make vulncheck: govulncheck over every module. It reports the known
# vulnerabilities (of the Go toolchain's standard library and of the
# modules required) that the code's calls can reach, and fails if there
# is one. VULNDB names the vulnerability database: https://vuln.go.dev
# unless set; VULNDB=module builds one from a pinned snapshot of
# golang.org/x/vulndb, for a machine that reaches only the Go module proxy
# (bump vulndb_snapshot to see newer reports).
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/local/lib.sh

govulncheck_version=v1.9.0
vulndb_snapshot=v0.0.0-20261105234957-e22db6528018

db=${VULNDB:-https://vuln.go.dev}
if [ "$db" = module ]; then
  dir=$PWD/.run/vulndb/$vulndb_snapshot
  if [ ! -f "$dir/index/db.json" ]; then
    log "building the vulnerability database from golang.org/x/vulndb@$vulndb_snapshot"
    osv=$(go mod download -json "golang.org/x/vulndb@$vulndb_snapshot" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/data/osv
    rm -rf "$dir"
    go run "golang.org/x/vulndb/cmd/indexdb@$vulndb_snapshot" -vulns "$osv" -out "$dir" || die "building the database failed"
  fi
  db=file://$dir
fi

status=0
for mod in $(go list -m -f '{{.Dir}}'); do
  log "govulncheck $(realpath --relative-to=. "$mod") ($(go env GOVERSION))"
  (cd "$mod" && go run "golang.org/x/vuln/cmd/govulncheck@$govulncheck_version" -db "$db" ./...) || status=1
done
exit $status
