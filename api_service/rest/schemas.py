"""REST bodies and response models (the OpenAPI document is built from these)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api_service.core.inputs import MessageInput


class CreateConversationBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str | None = None
    agent_id: str | None = None
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None


class AppendMessagesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: str | None = Field(
        default=None, description="Omit to append to the organization's default memory"
    )
    messages: list[MessageInput] = Field(min_length=1)


class PatchMessageBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str


class ConversationCreated(BaseModel):
    conversation_id: str


class MessagesAppended(BaseModel):
    appended: int
    message_ids: list[str]
    conversation_id: str | None = Field(
        default=None,
        description="Only when the request left conversation_id out: the default memory's id",
    )


class Conversation(BaseModel):
    id: str
    title: str | None
    agent_id: str | None
    tags: list[str]
    metadata: dict[str, Any]
    message_count: int
    created_at: str
    updated_at: str


class ConversationSummary(BaseModel):
    id: str
    title: str | None
    agent_id: str | None
    tags: list[str]
    message_count: int
    updated_at: str


class Message(BaseModel):
    id: str
    role: str
    content: str
    sequence: int
    created_at: str
    tool_call_id: str | None
    tool_name: str | None
    metadata: dict[str, Any] | None


class ConversationWithMessages(BaseModel):
    conversation: Conversation
    messages: list[Message]


class ConversationList(BaseModel):
    conversations: list[ConversationSummary]
    total: int


class Deleted(BaseModel):
    deleted: bool


class MessageUpdated(BaseModel):
    updated: bool
    message: Message


class Chunk(BaseModel):
    chunk_id: str
    conversation_id: str
    chunk_text: str
    score: float = Field(
        description="Relevance, highest first: the chunk's reciprocal rank fusion score, "
        "1/(60 + rank) summed over the vector and the full-text rankings that hold it (at most "
        "2/61). Not a cosine similarity, as MCP search's score is; compare it only within one "
        "response"
    )
    start_sequence: int
    end_sequence: int


class SearchResults(BaseModel):
    results: list[Chunk]
    total: int


class Error(BaseModel):
    error: str
    code: str


class Usage(BaseModel):
    month: str = Field(description="UTC month, YYYY-MM")
    requests: int = Field(description="Requests counted this month, refused ones included")
    requests_limit: int
    storage_bytes: int = Field(description="Stored message content and metadata, in bytes")
    storage_bytes_limit: int
    conversations: int
    conversations_limit: int
    messages: int = Field(description="Messages in all the org's conversations")
    messages_limit: int
