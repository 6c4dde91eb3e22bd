// Command llmserve-go-example calls an llmserve server with the stubs generated from
// proto/llmserve/v1/llmserve.proto (make gen writes them to gen/go). It runs the
// scenario of tests/client_scenario.py: model info, a two-turn Generate session, an
// in-band cancel, a bulk Embed and a rejected request whose google.rpc.BadRequest it
// decodes. Each step prints one JSON object per line.
//
//	LLMSERVE_ADDRESS=127.0.0.1:50051 ./llmserve-go-example
//
// Build it with build.sh (GOPATH mode, Debian 12's Go packages; docs/clients.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	pb "github.com/llmserve/llmserve/gen/go/llmserve/v1"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The scenario's inputs (tests/client_scenario.py).
const (
	turn1Text     = "The three primary colours are"
	turn2Text     = " And the three secondary colours are"
	cancelPrompt  = "Write a very long story about a lighthouse keeper."
	defaultAddr   = "127.0.0.1:50051" // make serve's address
	unaryTimeout  = 30 * time.Second
	streamTimeout = 120 * time.Second // a whole stream: every turn on it
)

var embedTexts = []string{"a red apple", "a green pear", "the stock market fell today"}

func main() {
	addr := os.Getenv("LLMSERVE_ADDRESS")
	if addr == "" {
		addr = defaultAddr
	}
	if err := run(addr); err != nil {
		fmt.Fprintln(os.Stderr, "llmserve-go-example:", err)
		os.Exit(1)
	}
}

func run(addr string) error {
	// Plaintext, as `llmserve serve` without TLS flags. grpc-go 1.33 (Debian 12) has no
	// credentials/insecure package yet; newer releases spell this
	// grpc.WithTransportCredentials(insecure.NewCredentials()).
	conn, err := grpc.Dial(addr, grpc.WithInsecure())
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	client := pb.NewLLMServiceClient(conn)

	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false) // print model text as is ("<", "&" stay readable)
	steps := []func(pb.LLMServiceClient, *json.Encoder) error{modelInfo, twoTurns, cancelTurn, embed, badRequest}
	for _, step := range steps {
		if err := step(client, out); err != nil {
			return err
		}
	}
	return nil
}

func modelInfo(client pb.LLMServiceClient, out *json.Encoder) error {
	ctx, cancel := context.WithTimeout(context.Background(), unaryTimeout)
	defer cancel()
	info, err := client.GetModelInfo(ctx, &pb.GetModelInfoRequest{})
	if err != nil {
		return fmt.Errorf("GetModelInfo: %w", err)
	}
	return out.Encode(modelInfoStep{"model_info", info.GetName(), info.GetNCtx(), info.GetEmbeddingModel().GetNEmbd()})
}

// twoTurns runs one Generate session of two turns: the second turn prefills only its
// own input, since the first turn's prompt and reply are still in the slot's KV cache.
func twoTurns(client pb.LLMServiceClient, out *json.Encoder) error {
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
	defer cancel()
	stream, err := client.Generate(ctx)
	if err != nil {
		return fmt.Errorf("Generate: %w", err)
	}
	// Only the first message carries the config. Proto3 `optional` fields are
	// pointers in Go: proto.Float32(0) asks for greedy sampling, nil for the default.
	first := &pb.GenerateRequest{
		Config: &pb.SessionConfig{
			Sampling: &pb.SamplingParams{Temperature: proto.Float32(0)},
			Stopping: &pb.StoppingCriteria{MaxTokens: proto.Int32(12)},
		},
		Input:     textInput(turn1Text),
		EndOfTurn: true,
	}
	second := &pb.GenerateRequest{Input: textInput(turn2Text), EndOfTurn: true}
	for i, req := range []*pb.GenerateRequest{first, second} {
		if err := send(stream, req); err != nil {
			return fmt.Errorf("Generate turn %d: send: %w", i+1, err)
		}
		chunks, text, end, err := readTurn(stream)
		if err != nil {
			return fmt.Errorf("Generate turn %d: %w", i+1, err)
		}
		usage := end.GetUsage()
		step := turnStep{"turn", i + 1, chunks, text, end.GetFinishReason().String(),
			usage.GetPromptTokens(), usage.GetCachedTokens(), usage.GetCompletionTokens()}
		if err := out.Encode(step); err != nil {
			return err
		}
	}
	return finish(stream)
}

// cancelTurn starts a long turn and stops it in-band after the first chunk: the turn
// ends with FINISH_REASON_CANCELLED and the session (and stream) stay usable.
func cancelTurn(client pb.LLMServiceClient, out *json.Encoder) error {
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
	defer cancel()
	stream, err := client.Generate(ctx)
	if err != nil {
		return fmt.Errorf("Generate (cancel): %w", err)
	}
	req := &pb.GenerateRequest{
		Config:    &pb.SessionConfig{Stopping: &pb.StoppingCriteria{MaxTokens: proto.Int32(400), IgnoreEos: true}},
		Input:     textInput(cancelPrompt),
		EndOfTurn: true,
	}
	if err := send(stream, req); err != nil {
		return fmt.Errorf("Generate (cancel): send: %w", err)
	}
	if _, err := stream.Recv(); err != nil {
		return fmt.Errorf("Generate (cancel): first chunk: %w", err)
	}
	if err := send(stream, &pb.GenerateRequest{Cancel: true}); err != nil {
		return fmt.Errorf("Generate (cancel): send cancel: %w", err)
	}
	// Chunks already on their way may arrive before the TurnEnd.
	_, _, end, err := readTurn(stream)
	if err != nil {
		return fmt.Errorf("Generate (cancel): %w", err)
	}
	step := cancelStep{"cancel", end.GetFinishReason().String(), end.GetUsage().GetCompletionTokens()}
	if err := out.Encode(step); err != nil {
		return err
	}
	return finish(stream)
}

// embed sends every text in one message; one result per input comes back, in order.
func embed(client pb.LLMServiceClient, out *json.Encoder) error {
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
	defer cancel()
	stream, err := client.Embed(ctx)
	if err != nil {
		return fmt.Errorf("Embed: %w", err)
	}
	req := &pb.EmbedRequest{}
	for _, text := range embedTexts {
		req.Inputs = append(req.Inputs, textInput(text))
	}
	if err := stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("Embed: send: %w", err)
	}
	if err := stream.CloseSend(); err != nil {
		return fmt.Errorf("Embed: half-close: %w", err)
	}
	step := embedStep{Step: "embed", Dims: []int{}, Indices: []uint64{}}
	for {
		res, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("Embed: %w", err)
		}
		step.Count++
		step.Dims = append(step.Dims, len(res.GetEmbedding()))
		step.Indices = append(step.Indices, res.GetIndex())
	}
	return out.Encode(step)
}

// badRequest sends an invalid config (max_tokens -1). The call fails with
// INVALID_ARGUMENT and a google.rpc.BadRequest in the status details
// (grpc-status-details-bin), which grpc-go decodes with status.Details().
func badRequest(client pb.LLMServiceClient, out *json.Encoder) error {
	ctx, cancel := context.WithTimeout(context.Background(), unaryTimeout)
	defer cancel()
	stream, err := client.Generate(ctx)
	if err != nil {
		return fmt.Errorf("Generate (bad request): %w", err)
	}
	req := &pb.GenerateRequest{
		Config:    &pb.SessionConfig{Stopping: &pb.StoppingCriteria{MaxTokens: proto.Int32(-1)}},
		Input:     textInput("Hi"),
		EndOfTurn: true,
	}
	// The call's status comes from Recv; io.EOF would mean it succeeded.
	err = send(stream, req)
	if err == nil {
		err = stream.CloseSend()
	}
	for err == nil {
		_, err = stream.Recv()
	}
	if errors.Is(err, io.EOF) {
		return errors.New("Generate (bad request): max_tokens -1 was accepted")
	}
	st := status.Convert(err)
	for _, detail := range st.Details() {
		if bad, ok := detail.(*errdetails.BadRequest); ok && len(bad.GetFieldViolations()) > 0 {
			violation := bad.GetFieldViolations()[0]
			// codes.Code.String() is Go-style ("InvalidArgument"); genproto's code
			// enum has the canonical name ("INVALID_ARGUMENT").
			name := code.Code_name[int32(st.Code())]
			return out.Encode(badRequestStep{"bad_request", name, violation.GetField(), violation.GetDescription()})
		}
	}
	return fmt.Errorf("Generate (bad request): no google.rpc.BadRequest in the status: %w", err)
}

func textInput(text string) *pb.Input {
	return &pb.Input{Kind: &pb.Input_Text{Text: text}}
}

// readTurn reads one turn's responses up to its TurnEnd: the number of chunks, their
// text and the TurnEnd.
func readTurn(stream pb.LLMService_GenerateClient) (int, string, *pb.TurnEnd, error) {
	chunks, text := 0, ""
	for {
		res, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return 0, "", nil, errors.New("stream ended before the TurnEnd")
		}
		if err != nil {
			return 0, "", nil, err
		}
		switch event := res.GetEvent().(type) {
		case *pb.GenerateResponse_Chunk:
			chunks++
			text += event.Chunk.GetText()
		case *pb.GenerateResponse_TurnEnd:
			return chunks, text, event.TurnEnd, nil
		}
	}
}

// finish half-closes the stream (the session ends) and reads it to its end: io.EOF
// means status OK.
func finish(stream pb.LLMService_GenerateClient) error {
	if err := stream.CloseSend(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	for {
		if _, err := stream.Recv(); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("after half-close: %w", err)
		}
	}
}

// send sends req on a Generate stream. Send's io.EOF only says that the server ended
// the call; Recv returns the call's status (a non-OK one as a status error).
func send(stream pb.LLMService_GenerateClient, req *pb.GenerateRequest) error {
	if err := stream.Send(req); !errors.Is(err, io.EOF) {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return err
		}
	}
}
