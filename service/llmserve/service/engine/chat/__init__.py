"""Conversations, chat templates and tool calling: the chat wing of the engine."""
