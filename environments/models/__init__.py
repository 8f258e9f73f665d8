"""Model clients behind one protocol (`base.ChatModel`): chat mode (`chat_mode`, an OpenAI chat
endpoint; tokens re-rendered by `chat_tokens`) and token mode (`token_mode/`, exact ids and logprobs)."""
