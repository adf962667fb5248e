"""Request and response bodies of the OpenAI-compatible API (pydantic v2), plus vLLM's extras.

A request field octavo does not implement is refused (400 naming the field), never silently
dropped: a client that asks for ``guided_json`` or ``best_of`` must not get unconstrained text back.
A short allow-list of OpenAI fields that change nothing about the generated text is accepted and
ignored: ``user`` (an end-user id for abuse tracking), ``store`` and ``metadata`` (OpenAI's
stored-completions dashboard). Chat messages keep unknown keys: they are handed to the chat
template, which may use them. Non-finite floats are refused; numbers are strict (``max_tokens: true`` or ``"5"`` is a 400, not 1 or 5); every
string is checked to be valid Unicode text (a lone surrogate such as ``"\ud800"`` is valid
JSON but no text: 400). Lists and maps a request may send are bounded (``MAX_*`` below) so that
no single request costs unbounded preparation time. Ranges that need the model (token ids in
the vocabulary, prompt + max_tokens within the context, prompt characters) are checked by the
serving code and also written into the published OpenAPI schema (``openapi.py``). Every refusal
becomes a 400 in OpenAI's error shape (see ``errors.py``).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

MAX_N = 128  # samples per prompt
MAX_LOGPROBS = 20  # top logprobs per position (OpenAI allows 20 for chat, vLLM's default cap)
MAX_PROMPTS = 1024  # prompts in one /v1/completions batch
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SEED_MAX = INT64_MAX - MAX_N  # seed + i for the i-th sample must stay an int64

MAX_STOP = 128  # stop strings per request
MAX_BAD_WORDS = 1024  # bad_words entries per request
MAX_WORD_CHARS = 4096  # characters of one stop string / bad word
MAX_LOGIT_BIAS = 1024  # logit_bias entries
MAX_TOKEN_ID_LIST = 1 << 16  # stop_token_ids / allowed_token_ids entries
MAX_MESSAGES = 4096  # chat messages per request
MAX_ID_CHARS = 256  # request_id, user, cache_salt, model

def _json_integer(value: Any) -> Any:
    """JSON Schema's ``integer``: ``2`` and ``2.0`` are integers, ``true`` and ``"2"`` are not."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be an integer")
    return value


# Request models are strict (no "true" for a bool, no "1.5" for a float); integers accept
# integral floats as JSON Schema does. ``x-octavo`` marks what the served model bounds
# (``openapi.py`` writes the served model's limits into the published schema).
Int = Annotated[int, Field(strict=False), BeforeValidator(_json_integer)]
Seed = Annotated[Int, Field(ge=INT64_MIN, le=SEED_MAX)]
Int32 = Annotated[Int, Field(ge=-(2**31), le=2**31 - 1)]
TokenId = Annotated[Int, Field(ge=0, le=2**31 - 1, json_schema_extra={"x-octavo": "token_id"})]
MaxTokens = Annotated[Int, Field(ge=1, json_schema_extra={"x-octavo": "max_tokens"})]


def check_text(value: str) -> str:
    """Refuse strings that are not Unicode text (lone UTF-16 surrogates, which JSON can carry
    as ``\\ud800`` escapes but no tokenizer or UTF-8 encoder accepts)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"contains a lone surrogate (U+{ord(value[e.start]):04X}) at character {e.start}; "
                "text must be valid Unicode"
            ) from None
    return value


def check_json_text(value: Any) -> Any:
    """``check_text`` on every string (keys too) inside a free-form JSON value."""
    if isinstance(value, str):
        check_text(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            check_json_text(k)
            check_json_text(v)
    elif isinstance(value, list):
        for v in value:
            check_json_text(v)
    return value


Text = Annotated[str, AfterValidator(check_text)]
PromptText = Annotated[str, Field(min_length=1, json_schema_extra={"x-octavo": "prompt_text"}),
                       AfterValidator(check_text)]
ShortText = Annotated[str, Field(max_length=MAX_ID_CHARS), AfterValidator(check_text)]
ModelName = Annotated[ShortText, Field(json_schema_extra={"x-octavo": "model_name"})]  # a served name
Word = Annotated[str, Field(min_length=1, max_length=MAX_WORD_CHARS), AfterValidator(check_text)]
JsonDict = Annotated[dict[str, Any], AfterValidator(check_json_text)]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


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


class SamplingFields(OpenAIModel):
    """Fields shared by completions and chat (OpenAI's, then vLLM's extras)."""

    model: ModelName | None = None
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: (
        Annotated[
            dict[Annotated[Text, Field(json_schema_extra={"x-octavo": "token_id_key"})],
                 Annotated[float, Field(ge=-100.0, le=100.0)]],
            Field(max_length=MAX_LOGIT_BIAS),
        ]
        | None
    ) = None
    n: Int | None = Field(default=1, ge=1, le=MAX_N)
    seed: Seed | None = None
    stop: Word | Annotated[list[Word], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    # Accepted and ignored (see the module docstring): they do not change the generated text.
    user: ShortText | None = None
    store: bool | None = None
    metadata: dict[ShortText, Text] | None = None
    # vLLM extras
    top_k: Int32 | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    ignore_eos: bool = False
    min_tokens: Int = Field(default=0, ge=0, le=2**31 - 1)
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_TOKEN_ID_LIST)] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    bad_words: Annotated[list[Word], Field(max_length=MAX_BAD_WORDS)] | None = None
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1, max_length=MAX_TOKEN_ID_LIST)] | None = None
    prompt_logprobs: Int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    priority: Int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    cache_salt: Annotated[ShortText, Field(min_length=1)] | None = None
    request_id: ShortText | None = None
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
    prompt: (
        PromptText
        | Annotated[list[PromptText], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    best_of: Int | None = Field(default=None, ge=1, le=MAX_N)
    echo: bool | None = False
    logprobs: Int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_tokens: MaxTokens | None = 16
    suffix: Text | None = None
    add_special_tokens: bool = True


class TextPart(OpenAIModel):
    """A content part of a chat message: text only."""

    type: Literal["text"]
    text: Text


class ChatMessage(OpenAIModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Text | list[TextPart] | None = None
    name: ShortText | None = None

    @model_validator(mode="after")
    def _extra_text(self) -> ChatMessage:
        check_json_text(self.model_extra)
        return self


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
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    logprobs: bool | None = False
    top_logprobs: Int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM extras
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: JsonDict | None = None

    _no_echo = field_validator("echo")(only_default(False, "echo in chat completions"))


class TokenizeCompletionRequest(OpenAIModel):
    model: ModelName | None = None
    prompt: PromptText
    add_special_tokens: bool = True


class TokenizeChatRequest(OpenAIModel):
    model: ModelName | None = None
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[ChatTool] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: JsonDict | None = None


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class DetokenizeRequest(OpenAIModel):
    model: ModelName | None = None
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


class PromptLogprob(BaseModel):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


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
    prompt_logprobs: PromptLogprobs | None = None


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
