package main

// The JSON line each step of the scenario prints (tests/client_scenario.py checks them).
// encoding/json writes struct fields in their order: the order of the keys.

type modelInfoStep struct {
	Step         string `json:"step"`
	Name         string `json:"name"`
	NCtx         int32  `json:"n_ctx"`
	EmbeddingDim int32  `json:"embedding_dim"`
}

type turnStep struct {
	Step             string `json:"step"`
	Turn             int    `json:"turn"`
	Chunks           int    `json:"chunks"`
	Text             string `json:"text"`
	FinishReason     string `json:"finish_reason"`
	PromptTokens     int32  `json:"prompt_tokens"`
	CachedTokens     int32  `json:"cached_tokens"`
	CompletionTokens int32  `json:"completion_tokens"`
}

type cancelStep struct {
	Step             string `json:"step"`
	FinishReason     string `json:"finish_reason"`
	CompletionTokens int32  `json:"completion_tokens"`
}

type embedStep struct {
	Step    string   `json:"step"`
	Count   int      `json:"count"`
	Dims    []int    `json:"dims"`
	Indices []uint64 `json:"indices"`
}

type badRequestStep struct {
	Step        string `json:"step"`
	Code        string `json:"code"`
	Field       string `json:"field"`
	Description string `json:"description"`
}
