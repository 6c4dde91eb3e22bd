// The client scenario of tests/client_scenario.py, in Java, on the stubs that
// `make gen` (python -m tools.gen --lang java) writes to gen/java.
//
//   client/examples/java/build.sh /tmp/llmserve-java     # compile; writes run.sh there
//   LLMSERVE_ADDRESS=127.0.0.1:50051 /tmp/llmserve-java/run.sh
//
// Prints one JSON object per line (model_info, turn, turn, cancel, embed, bad_request)
// and exits 0; on any unexpected error it prints the reason on stderr and exits 1.

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import com.google.protobuf.Any;
import com.google.rpc.BadRequest;
import dev.llmserve.v1.EmbedRequest;
import dev.llmserve.v1.EmbedResponse;
import dev.llmserve.v1.GenerateRequest;
import dev.llmserve.v1.GenerateResponse;
import dev.llmserve.v1.GetModelInfoRequest;
import dev.llmserve.v1.Input;
import dev.llmserve.v1.LLMServiceGrpc;
import dev.llmserve.v1.ModelInfo;
import dev.llmserve.v1.SamplingParams;
import dev.llmserve.v1.SessionConfig;
import dev.llmserve.v1.StoppingCriteria;
import dev.llmserve.v1.TurnEnd;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.StreamObserver;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

public final class Scenario {
    static final String TURN_1 = "The three primary colours are";
    static final String TURN_2 = " And the three secondary colours are";
    static final String CANCEL_PROMPT = "Write a very long story about a lighthouse keeper.";
    static final String[] EMBED_TEXTS = {"a red apple", "a green pear", "the stock market fell today"};

    /** Every call gets this deadline; a stream's whole life counts against it. */
    static final long DEADLINE_SECONDS = 60;

    // disableHtmlEscaping: print "<" as "<", not "\u003c" (both are valid JSON).
    static final Gson GSON = new GsonBuilder().disableHtmlEscaping().create();

    public static void main(String[] args) {
        String address = System.getenv("LLMSERVE_ADDRESS");
        if (address == null || address.isEmpty()) {
            System.err.println("scenario: set LLMSERVE_ADDRESS (host:port of llmserve)");
            System.exit(2);
        }
        // Plaintext HTTP/2; the transport is grpc-netty, found through ServiceLoader.
        ManagedChannel channel = ManagedChannelBuilder.forTarget(address).usePlaintext().build();
        int code = 0;
        try {
            run(channel);
        } catch (Exception e) {
            System.err.println("scenario failed: " + e);
            e.printStackTrace();
            code = 1;
        } finally {
            channel.shutdownNow();
        }
        System.exit(code);
    }

    static void run(ManagedChannel channel) throws Exception {
        modelInfo(blocking(channel));
        turns(channel);
        cancel(channel);
        embed(channel);
        badRequest(channel);
    }

    // withDeadlineAfter returns a new stub whose deadline starts now (stubs are
    // immutable): take a fresh one for each call, not one for the whole program.
    static LLMServiceGrpc.LLMServiceBlockingStub blocking(ManagedChannel channel) {
        return LLMServiceGrpc.newBlockingStub(channel).withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS);
    }

    static LLMServiceGrpc.LLMServiceStub async(ManagedChannel channel) {
        return LLMServiceGrpc.newStub(channel).withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS);
    }

    static void modelInfo(LLMServiceGrpc.LLMServiceBlockingStub stub) {
        ModelInfo info = stub.getModelInfo(GetModelInfoRequest.getDefaultInstance());
        JsonObject out = step("model_info");
        out.addProperty("name", info.getName());
        out.addProperty("n_ctx", info.getNCtx());
        out.addProperty("embedding_dim", info.getEmbeddingModel().getNEmbd());
        print(out);
    }

    /** Two turns on one Generate stream: the session (and its KV cache) carries over. */
    static void turns(ManagedChannel channel) throws InterruptedException {
        Replies<GenerateResponse> replies = new Replies<>();
        StreamObserver<GenerateRequest> requests = async(channel).generate(replies);
        SessionConfig config = SessionConfig.newBuilder()
                .setSampling(SamplingParams.newBuilder().setTemperature(0))
                .setStopping(StoppingCriteria.newBuilder().setMaxTokens(12))
                .build();
        // The config goes on the first message only.
        requests.onNext(GenerateRequest.newBuilder()
                .setConfig(config).setInput(text(TURN_1)).setEndOfTurn(true).build());
        printTurn(1, replies);
        requests.onNext(GenerateRequest.newBuilder().setInput(text(TURN_2)).setEndOfTurn(true).build());
        printTurn(2, replies);
        requests.onCompleted();  // half-close: the server ends the call with OK
        replies.expectEnd();
    }

    /** Reads one turn's chunks up to its TurnEnd and prints the "turn" step. */
    static void printTurn(int turn, Replies<GenerateResponse> replies) throws InterruptedException {
        StringBuilder text = new StringBuilder();
        int chunks = 0;
        TurnEnd end = null;
        while (end == null) {
            GenerateResponse reply = replies.next();
            if (reply.hasChunk()) {
                chunks++;
                text.append(reply.getChunk().getText());
            } else if (reply.hasTurnEnd()) {
                end = reply.getTurnEnd();
            }
        }
        JsonObject out = step("turn");
        out.addProperty("turn", turn);
        out.addProperty("chunks", chunks);
        out.addProperty("text", text.toString());
        out.addProperty("finish_reason", end.getFinishReason().name());
        out.addProperty("prompt_tokens", end.getUsage().getPromptTokens());
        out.addProperty("cached_tokens", end.getUsage().getCachedTokens());
        out.addProperty("completion_tokens", end.getUsage().getCompletionTokens());
        print(out);
    }

    /** In-band cancel: the turn ends CANCELLED, the stream (session) stays open. */
    static void cancel(ManagedChannel channel) throws InterruptedException {
        Replies<GenerateResponse> replies = new Replies<>();
        StreamObserver<GenerateRequest> requests = async(channel).generate(replies);
        SessionConfig config = SessionConfig.newBuilder()
                .setStopping(StoppingCriteria.newBuilder().setMaxTokens(400).setIgnoreEos(true))
                .build();
        requests.onNext(GenerateRequest.newBuilder()
                .setConfig(config).setInput(text(CANCEL_PROMPT)).setEndOfTurn(true).build());
        boolean cancelled = false;
        TurnEnd end = null;
        while (end == null) {
            GenerateResponse reply = replies.next();
            if (reply.hasChunk() && !cancelled) {
                requests.onNext(GenerateRequest.newBuilder().setCancel(true).build());
                cancelled = true;
            } else if (reply.hasTurnEnd()) {
                end = reply.getTurnEnd();
            }
        }
        requests.onCompleted();
        replies.expectEnd();
        JsonObject out = step("cancel");
        out.addProperty("finish_reason", end.getFinishReason().name());
        out.addProperty("completion_tokens", end.getUsage().getCompletionTokens());
        print(out);
    }

    /** One Embed message with three inputs; one EmbedResponse comes back for each. */
    static void embed(ManagedChannel channel) throws InterruptedException {
        Replies<EmbedResponse> replies = new Replies<>();
        StreamObserver<EmbedRequest> requests = async(channel).embed(replies);
        EmbedRequest.Builder request = EmbedRequest.newBuilder();
        for (String t : EMBED_TEXTS) {
            request.addInputs(text(t));
        }
        requests.onNext(request.build());
        requests.onCompleted();
        JsonArray dims = new JsonArray();
        JsonArray indices = new JsonArray();
        for (EmbedResponse reply = replies.nextOrEnd(); reply != null; reply = replies.nextOrEnd()) {
            dims.add(reply.getEmbeddingCount());
            indices.add(reply.getIndex());  // uint64 in the proto: a Java long
        }
        JsonObject out = step("embed");
        out.addProperty("count", dims.size());
        out.add("dims", dims);
        out.add("indices", indices);
        print(out);
    }

    /** An invalid config: the call fails with INVALID_ARGUMENT and a google.rpc.BadRequest. */
    static void badRequest(ManagedChannel channel) throws Exception {
        Replies<GenerateResponse> replies = new Replies<>();
        StreamObserver<GenerateRequest> requests = async(channel).generate(replies);
        SessionConfig config = SessionConfig.newBuilder()
                .setStopping(StoppingCriteria.newBuilder().setMaxTokens(-1))
                .build();
        requests.onNext(GenerateRequest.newBuilder()
                .setConfig(config).setInput(text("Hi")).setEndOfTurn(true).build());
        requests.onCompleted();
        StatusRuntimeException error;
        try {
            while (replies.nextOrEnd() != null) {}  // a reply before the error: harmless
            throw new IllegalStateException("bad_request: max_tokens -1 was accepted");
        } catch (StatusRuntimeException e) {
            error = e;
        }
        // The details travel in the grpc-status-details-bin trailer as a serialized
        // google.rpc.Status; StatusProto decodes it (null when the trailer is absent).
        com.google.rpc.Status status = StatusProto.fromThrowable(error);
        BadRequest violation = null;
        for (Any detail : status != null ? status.getDetailsList() : List.<Any>of()) {
            if (detail.is(BadRequest.class)) {
                violation = detail.unpack(BadRequest.class);
            }
        }
        if (violation == null || violation.getFieldViolationsCount() == 0) {
            throw new IllegalStateException("bad_request: no BadRequest in the status details", error);
        }
        JsonObject out = step("bad_request");
        out.addProperty("code", Status.fromThrowable(error).getCode().name());
        out.addProperty("field", violation.getFieldViolations(0).getField());
        out.addProperty("description", violation.getFieldViolations(0).getDescription());
        print(out);
    }

    static Input text(String s) {
        return Input.newBuilder().setText(s).build();
    }

    static JsonObject step(String name) {
        JsonObject out = new JsonObject();  // keeps insertion order
        out.addProperty("step", name);
        return out;
    }

    static void print(JsonObject line) {
        System.out.println(GSON.toJson(line));
        System.out.flush();
    }

    /**
     * The receiving side of a streaming call, read from the calling thread: gRPC's
     * threads put each message, the error or the end into a queue. (The async stub's
     * callbacks must not block; a blocking read loop is easier to follow.)
     */
    static final class Replies<T> implements StreamObserver<T> {
        private static final Object END = new Object();
        private final BlockingQueue<Object> queue = new LinkedBlockingQueue<>();

        @Override public void onNext(T value) { queue.add(value); }
        @Override public void onError(Throwable t) { queue.add(t); }
        @Override public void onCompleted() { queue.add(END); }

        /** The next message, or null when the call ended with OK; throws the call's error. */
        @SuppressWarnings("unchecked")
        T nextOrEnd() throws InterruptedException {
            // The call's deadline ends it with DEADLINE_EXCEEDED (an onError); this
            // timeout only guards against a bug that would leave the queue empty.
            Object item = queue.poll(DEADLINE_SECONDS + 10, TimeUnit.SECONDS);
            if (item == null) {
                throw new IllegalStateException("no reply and no end of call in time");
            }
            if (item == END || item instanceof Throwable) {
                queue.add(item);  // the end is final: a later read sees it again
            }
            if (item == END) {
                return null;
            }
            if (item instanceof Throwable) {
                // gRPC reports a failed call as StatusRuntimeException, with the trailers.
                throw item instanceof StatusRuntimeException
                        ? (StatusRuntimeException) item
                        : Status.fromThrowable((Throwable) item).asRuntimeException();
            }
            return (T) item;
        }

        /** The next message; the call ending here is an error. */
        T next() throws InterruptedException {
            T item = nextOrEnd();
            if (item == null) {
                throw new IllegalStateException("the call ended before the turn did");
            }
            return item;
        }

        /** The call must end now, with OK. */
        void expectEnd() throws InterruptedException {
            T item = nextOrEnd();
            if (item != null) {
                throw new IllegalStateException("a reply where the call should have ended: " + item);
            }
        }
    }
}
