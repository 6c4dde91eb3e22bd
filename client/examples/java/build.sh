#!/bin/sh
# Compile the generated Java stubs (gen/java, from `make gen`) and Scenario.java against
# Debian 12's jars (/usr/share/java; no Maven), and write OUT/run.sh to run it.
#
#   client/examples/java/build.sh OUT        # OUT/classes, OUT/classpath, OUT/run.sh
#   LLMSERVE_ADDRESS=127.0.0.1:50051 OUT/run.sh
#   client/examples/java/build.sh --check    # only report what is missing (exit 1 if any)
#
# JAVA_JARS overrides the jar directory (default /usr/share/java).
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GEN="$ROOT/gen/java"
JARS="${JAVA_JARS:-/usr/share/java}"

# The classpath, jar by jar, with the Debian package of each.
#   compile and run: the generated code and Scenario.java use these directly
COMPILE="grpc-api:libgrpc-java grpc-stub:libgrpc-java grpc-protobuf:libgrpc-java
protobuf:libprotobuf-java guava:libguava-java gson:libgoogle-gson-java"
#   compile only: @javax.annotation.Generated on the stubs (source retention)
ANNOTATIONS="geronimo-annotation-1.3-spec:libgeronimo-annotation-1.3-spec-java"
#   run only: the gRPC core, its Netty transport (found through ServiceLoader) and their deps
RUNTIME="grpc-core:libgrpc-java grpc-context:libgrpc-java grpc-netty:libgrpc-java
grpc-protobuf-lite:libgrpc-java perfmark-api:libperfmark-java
netty-common:libnetty-java netty-buffer:libnetty-java netty-transport:libnetty-java
netty-resolver:libnetty-java netty-codec:libnetty-java netty-handler:libnetty-java
netty-codec-http:libnetty-java netty-codec-http2:libnetty-java"

missing=""
need() {  # need PROGRAM PACKAGE: note it when it is not installed
    command -v "$1" >/dev/null 2>&1 || missing="$missing $1 ($2)"
}
need_jars() {  # need_jars "jar:package ...": note each jar that is not there
    for entry in $1; do
        [ -f "$JARS/${entry%%:*}.jar" ] || missing="$missing $JARS/${entry%%:*}.jar (${entry#*:})"
    done
}
classpath() {  # classpath "jar:package ..." -> /usr/share/java/a.jar:...
    for entry in $1; do printf '%s' "${cp_sep:-}$JARS/${entry%%:*}.jar"; cp_sep=:; done
}
need javac openjdk-17-jdk-headless
need java openjdk-17-jdk-headless
need_jars "$COMPILE $ANNOTATIONS $RUNTIME"
COMPILE_CP=$(classpath "$COMPILE $ANNOTATIONS")
RUN_CP=$(classpath "$COMPILE $RUNTIME")
[ -f "$GEN/dev/llmserve/v1/LLMServiceGrpc.java" ] && [ -f "$GEN/com/google/rpc/BadRequest.java" ] \
    || missing="$missing $GEN (run make gen, or: python -m tools.gen --lang java)"

if [ -n "$missing" ]; then
    echo "build.sh: missing:$missing" >&2
    exit 1
fi
if [ "${1:-}" = "--check" ]; then
    exit 0
fi
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR | --check" >&2; exit 2; }

mkdir -p "$1"
OUT=$(cd "$1" && pwd)
rm -rf "$OUT/classes"
# The generated sources in an @argfile (no command-line length limit), one quoted path a line.
{ find "$GEN" -name '*.java' | sort; echo "$HERE/Scenario.java"; } | sed 's/.*/"&"/' >"$OUT/sources.txt"
javac -nowarn -encoding UTF-8 --release 17 -d "$OUT/classes" -cp "$COMPILE_CP" "@$OUT/sources.txt"

echo "$OUT/classes:$RUN_CP" >"$OUT/classpath"
cat >"$OUT/run.sh" <<EOF
#!/bin/sh
# Written by client/examples/java/build.sh. Needs LLMSERVE_ADDRESS=host:port.
exec java -cp "$OUT/classes:$RUN_CP" Scenario "\$@"
EOF
chmod +x "$OUT/run.sh"
echo "build.sh: built $OUT/classes; run: LLMSERVE_ADDRESS=host:port $OUT/run.sh"
