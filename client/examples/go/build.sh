#!/bin/sh
# Build the Go example client (main.go) into $1, against the stubs in gen/go.
#
#   make gen                                     # or: .venv/bin/python -m tools.gen --lang go
#   client/examples/go/build.sh build/llmserve-go-example
#
# Offline, with Debian 12's Go packages (make client-tools): GOPATH mode over
# /usr/share/gocode, where golang-google-grpc-dev, golang-google-genproto-dev,
# golang-google-protobuf-dev and golang-github-golang-protobuf-1-5-dev put their
# sources. No go.mod and no module proxy. A temporary GOPATH holds the import path of
# the generated code (go_package github.com/llmserve/llmserve/gen/go/llmserve/v1):
# a symlink to this repository's gen/ and one to this directory. docs/clients.md.
set -eu

if [ $# -ne 1 ]; then
	echo "usage: $0 OUTPUT_BINARY" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
case $1 in
/*) out=$1 ;;
*) out=$(pwd)/$1 ;;
esac

if ! command -v go >/dev/null 2>&1; then
	echo "build.sh: go not found: make client-tools (apt-get install golang-go ...)" >&2
	exit 1
fi
if [ ! -f "$root/gen/go/llmserve/v1/llmserve.pb.go" ] || [ ! -f "$root/gen/go/llmserve/v1/llmserve_grpc.pb.go" ]; then
	echo "build.sh: $root/gen/go has no generated Go stubs: run make gen (or .venv/bin/python -m tools.gen --lang go)" >&2
	exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
repo=$work/src/github.com/llmserve/llmserve
mkdir -p "$repo/client/examples"
ln -s "$root/gen" "$repo/gen"
ln -s "$here" "$repo/client/examples/go"

export GO111MODULE=off GOPATH="$work:/usr/share/gocode" GOFLAGS= GOPROXY=off
# The build cache speeds up rebuilds (grpc-go takes a while on few cores); any writable
# place will do when the default one (~/.cache/go-build) is not.
cache=$(go env GOCACHE 2>/dev/null || true)
if [ -z "$cache" ] || [ "$cache" = off ] || ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
	cache=$work/go-build
fi
export GOCACHE=$cache

# grpc-go 1.33 marshals through github.com/golang/protobuf. Version 1.3 of it (Debian's
# golang-goprotobuf-dev) cannot handle protoc-gen-go 1.28's messages: the first Send
# segfaults in proto.makeOneOfMarshaler. 1.5 is a wrapper over google.golang.org/protobuf.
pkg=github.com/golang/protobuf/proto
if ! go list -f '{{join .Imports "\n"}}' "$pkg" | grep -qx 'google.golang.org/protobuf/proto'; then
	echo "build.sh: $pkg in $(go list -f '{{.Dir}}' "$pkg" 2>/dev/null || echo '(not found)') is not version 1.5:" \
		"install golang-github-golang-protobuf-1-5-dev (1.3 segfaults grpc-go on the first Send)" >&2
	exit 1
fi

mkdir -p "$(dirname "$out")"
go build -o "$out" github.com/llmserve/llmserve/client/examples/go
echo "build.sh: built $out ($pkg from $(go list -f '{{.Dir}}' "$pkg"))" >&2
