// The llmserve client scenario (tests/client_scenario.py) in C++, on the stubs that
// `make gen` writes to gen/cpp with Debian 12's protoc and grpc_cpp_plugin.
//
//   LLMSERVE_ADDRESS=127.0.0.1:50051 ./scenario
//
// Prints one JSON object per line: model_info, two turns of one Generate session, an
// in-band cancel, one Embed stream, and the google.rpc.BadRequest of a rejected call.
// Exits 1 with a message on stderr on any unexpected error.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "google/rpc/code.pb.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "llmserve/v1/llmserve.grpc.pb.h"

namespace {

namespace v1 = llmserve::v1;
using GenerateStream = grpc::ClientReaderWriter<v1::GenerateRequest, v1::GenerateResponse>;

constexpr char kTurn1[] = "The three primary colours are";
constexpr char kTurn2[] = " And the three secondary colours are";
constexpr char kCancelPrompt[] = "Write a very long story about a lighthouse keeper.";
const std::vector<std::string> kEmbedTexts = {"a red apple", "a green pear", "the stock market fell today"};

// ---------------------------------------------------------------- JSON output

// A JSON string literal. Protobuf has already checked that string fields are valid
// UTF-8, so only quotes, backslashes and control characters need escaping.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// One JSON object, built key by key and printed as one line.
class JsonLine {
 public:
  explicit JsonLine(const std::string& step) { Raw("step", Quote(step)); }
  JsonLine& Str(const std::string& key, const std::string& value) { return Raw(key, Quote(value)); }
  JsonLine& Int(const std::string& key, long long value) { return Raw(key, std::to_string(value)); }
  JsonLine& Ints(const std::string& key, const std::vector<long long>& values) {
    std::string list = "[";
    for (size_t i = 0; i < values.size(); ++i) list += (i ? ", " : "") + std::to_string(values[i]);
    return Raw(key, list + "]");
  }
  void Print() const { std::cout << "{" << body_ << "}" << std::endl; }

 private:
  JsonLine& Raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ", ") + Quote(key) + ": " + json;
    return *this;
  }
  std::string body_;
};

// ---------------------------------------------------------------- helpers

[[noreturn]] void Fail(const std::string& what) { throw std::runtime_error(what); }

// The status code's name as in google/rpc/code.proto ("INVALID_ARGUMENT"): grpc::StatusCode
// uses the same numbers.
std::string CodeName(grpc::StatusCode code) {
  return google::rpc::Code_Name(static_cast<google::rpc::Code>(code));
}

void CheckOk(const grpc::Status& status, const std::string& what) {
  if (!status.ok()) Fail(what + " failed: " + CodeName(status.error_code()) + ": " + status.error_message());
}

// Every call gets a deadline: a ClientContext is single-use, one per call.
std::unique_ptr<grpc::ClientContext> ContextWithDeadline(int seconds) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return context;
}

v1::GenerateRequest TextTurn(const std::string& text) {
  v1::GenerateRequest request;
  request.mutable_input()->set_text(text);
  request.set_end_of_turn(true);
  return request;
}

// Half-closes the stream, reads whatever is left and checks the call ended with OK.
void FinishStream(GenerateStream& stream, const std::string& what) {
  stream.WritesDone();
  v1::GenerateResponse response;
  while (stream.Read(&response)) {
  }
  CheckOk(stream.Finish(), what);
}

struct Turn {
  int chunks = 0;
  std::string text;
  v1::TurnEnd end;
};

// Reads one turn: TokenChunks until the TurnEnd. `on_chunk` runs after each chunk.
template <typename OnChunk>
Turn ReadTurn(GenerateStream& stream, OnChunk on_chunk) {
  Turn turn;
  v1::GenerateResponse response;
  while (stream.Read(&response)) {
    switch (response.event_case()) {
      case v1::GenerateResponse::kChunk:
        ++turn.chunks;
        turn.text += response.chunk().text();
        on_chunk(turn);
        break;
      case v1::GenerateResponse::kTurnEnd:
        turn.end = response.turn_end();
        return turn;
      default:  // prompt logprobs: not asked for here
        break;
    }
  }
  // The stream ended without a TurnEnd: Finish() says why.
  CheckOk(stream.Finish(), "Generate");
  Fail("Generate: the stream ended before the TurnEnd");
}

Turn ReadTurn(GenerateStream& stream) {
  return ReadTurn(stream, [](const Turn&) {});
}

// ---------------------------------------------------------------- the steps

void ModelInfo(v1::LLMService::Stub& stub) {
  auto context = ContextWithDeadline(30);
  v1::ModelInfo info;
  CheckOk(stub.GetModelInfo(context.get(), v1::GetModelInfoRequest(), &info), "GetModelInfo");
  JsonLine("model_info")
      .Str("name", info.name())
      .Int("n_ctx", info.n_ctx())
      .Int("embedding_dim", info.embedding_model().n_embd())
      .Print();
}

// One session, two turns: the second turn prefills only its own tokens.
void TwoTurns(v1::LLMService::Stub& stub) {
  auto context = ContextWithDeadline(120);
  auto stream = stub.Generate(context.get());

  v1::GenerateRequest first = TextTurn(kTurn1);
  v1::SessionConfig* config = first.mutable_config();  // only on the stream's first message
  config->mutable_sampling()->set_temperature(0);       // optional field: 0 is sent, means greedy
  config->mutable_stopping()->set_max_tokens(12);

  const std::string turns[] = {kTurn1, kTurn2};
  for (int i = 0; i < 2; ++i) {
    // A failed Write means the call is over; ReadTurn then reports its status.
    stream->Write(i == 0 ? first : TextTurn(turns[i]));
    Turn turn = ReadTurn(*stream);
    const v1::Usage& usage = turn.end.usage();
    JsonLine("turn")
        .Int("turn", i + 1)
        .Int("chunks", turn.chunks)
        .Str("text", turn.text)
        .Str("finish_reason", v1::FinishReason_Name(turn.end.finish_reason()))
        .Int("prompt_tokens", usage.prompt_tokens())
        .Int("cached_tokens", usage.cached_tokens())
        .Int("completion_tokens", usage.completion_tokens())
        .Print();
  }
  FinishStream(*stream, "Generate");
}

// In-band cancel: the turn ends with FINISH_REASON_CANCELLED and the session stays open.
void Cancel(v1::LLMService::Stub& stub) {
  auto context = ContextWithDeadline(120);
  auto stream = stub.Generate(context.get());

  v1::GenerateRequest first = TextTurn(kCancelPrompt);
  first.mutable_config()->mutable_stopping()->set_max_tokens(400);
  first.mutable_config()->mutable_stopping()->set_ignore_eos(true);
  stream->Write(first);

  v1::GenerateRequest cancel;
  cancel.set_cancel(true);
  // Chunks already in flight may still arrive after the cancel; read on to the TurnEnd.
  Turn turn = ReadTurn(*stream, [&](const Turn& t) {
    if (t.chunks == 1) stream->Write(cancel);
  });
  JsonLine("cancel")
      .Str("finish_reason", v1::FinishReason_Name(turn.end.finish_reason()))
      .Int("completion_tokens", turn.end.usage().completion_tokens())
      .Print();
  FinishStream(*stream, "Generate (cancel)");
}

void Embed(v1::LLMService::Stub& stub) {
  auto context = ContextWithDeadline(60);
  auto stream = stub.Embed(context.get());

  v1::EmbedRequest request;
  for (const std::string& text : kEmbedTexts) request.add_inputs()->set_text(text);
  stream->Write(request);
  stream->WritesDone();

  std::vector<long long> dims, indices;
  v1::EmbedResponse response;
  while (stream->Read(&response)) {  // one result per input, in input order
    dims.push_back(response.embedding_size());
    indices.push_back(static_cast<long long>(response.index()));
  }
  CheckOk(stream->Finish(), "Embed");
  JsonLine("embed").Int("count", static_cast<long long>(dims.size())).Ints("dims", dims).Ints("indices", indices).Print();
}

// A rejected call: the server's google.rpc.Status travels in the grpc-status-details-bin
// trailer, which grpc::Status::error_details() returns serialized.
void BadRequest(v1::LLMService::Stub& stub) {
  auto context = ContextWithDeadline(30);
  auto stream = stub.Generate(context.get());

  v1::GenerateRequest first = TextTurn("Hi");
  first.mutable_config()->mutable_stopping()->set_max_tokens(-1);
  stream->Write(first);
  stream->WritesDone();
  v1::GenerateResponse response;
  while (stream->Read(&response)) {
  }
  grpc::Status status = stream->Finish();
  if (status.ok()) Fail("Generate with max_tokens -1 was accepted");

  google::rpc::Status details;
  if (!details.ParseFromString(status.error_details())) Fail("error details: not a google.rpc.Status");
  for (const google::protobuf::Any& detail : details.details()) {
    google::rpc::BadRequest bad;
    if (!detail.UnpackTo(&bad) || bad.field_violations_size() == 0) continue;  // another detail type
    JsonLine("bad_request")
        .Str("code", CodeName(status.error_code()))
        .Str("field", bad.field_violations(0).field())
        .Str("description", bad.field_violations(0).description())
        .Print();
    return;
  }
  Fail("no google.rpc.BadRequest in the error details of: " + status.error_message());
}

}  // namespace

int main() {
  const char* address = std::getenv("LLMSERVE_ADDRESS");
  if (address == nullptr || *address == '\0') {
    std::cerr << "set LLMSERVE_ADDRESS (host:port of llmserve)" << std::endl;
    return 2;
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::LLMService::NewStub(channel);
  try {
    ModelInfo(*stub);
    TwoTurns(*stub);
    Cancel(*stub);
    Embed(*stub);
    BadRequest(*stub);
  } catch (const std::exception& error) {
    std::cerr << "scenario: " << error.what() << std::endl;
    return 1;
  }
  return 0;
}
