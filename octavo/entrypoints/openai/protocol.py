"""Request and response bodies of the OpenAI-compatible API (pydantic v2), plus vLLM's extras.

A request field octavo does not implement is refused (400 naming the field), never silently
dropped: a client that asks for ``guided_json`` or ``best_of`` must not get unconstrained text back.
A short allow-list of OpenAI fields that change nothing about the generated text is accepted and
ignored: ``user`` (an end-user id for abuse tracking), ``store`` and ``metadata`` (OpenAI's
stored-completions dashboard). Chat messages keep unknown keys: they are handed to the chat template,
which may use them. Non-finite floats are refused; ranges that need the model (token ids in the vocabulary, prompt + max_tokens within
the context) are checked by the input processor. Every refusal becomes a 400 in OpenAI's error
shape (see ``errors.py``).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 128  # samples per prompt
MAX_LOGPROBS = 20  # top logprobs per position (OpenAI allows 20 for chat, vLLM's default cap)
MAX_PROMPTS = 1024  # prompts in one /v1/completions batch
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SEED_MAX = INT64_MAX - MAX_N  # seed + i for the i-th sample must stay an int64

Seed = Annotated[int, Field(ge=INT64_MIN, le=SEED_MAX)]
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def only_default(default: Any, what: str):
    """A validator for a field octavo knows but implements only at its default value."""

    def check(cls, v: Any) -> Any:
        if v is not None and v != default:
            raise ValueError(f"{what} is not supported (only {default!r})")
        return v

    return check


class StreamOptions(OpenAIModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False

    _no_continuous = field_validator("continuous_usage_stats")(only_default(False, "continuous_usage_stats"))


class SamplingFields(OpenAIModel):
    """Fields shared by completions and chat (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    n: int | None = Field(default=1, ge=1, le=MAX_N)
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    # Accepted and ignored (see the module docstring): they do not change the generated text.
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    # vLLM extras
    top_k: Int32 | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, le=2**31 - 1)
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    bad_words: list[str] | None = None
    allowed_token_ids: list[TokenId] | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    cache_salt: str | None = Field(default=None, min_length=1)
    request_id: str | None = Field(default=None, max_length=256)
    # Structured outputs (see structured_outputs.py): OpenAI's response_format, vLLM's
    # structured_outputs and its older guided_* names.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    _spaces = field_validator("spaces_between_special_tokens")(
        only_default(True, "spaces_between_special_tokens=false")
    )


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    echo: bool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_tokens: int | None = Field(default=16, ge=1)
    suffix: str | None = None
    add_special_tokens: bool = True


class ChatMessage(OpenAIModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class FunctionDefinition(OpenAIModel):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted: required/named calls are always grammar-constrained


class ChatTool(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM extras
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    _no_echo = field_validator("echo")(only_default(False, "echo in chat completions"))


class TokenizeCompletionRequest(OpenAIModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(OpenAIModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[TokenId]


# -- responses --------------------------------------------------------------------------------
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # with --reasoning-parser
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "octavo"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str
