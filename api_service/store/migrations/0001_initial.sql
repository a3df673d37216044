-- Initial schema. Every tenant table carries org_id and leads its primary and unique keys
-- with it, so the schema can be distributed by org.

CREATE TABLE plans (
    name               text PRIMARY KEY,
    monthly_requests   bigint NOT NULL CHECK (monthly_requests >= 0),
    storage_bytes      bigint NOT NULL CHECK (storage_bytes >= 0),
    max_conversations  bigint NOT NULL CHECK (max_conversations >= 0),
    created_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE orgs (
    org_id      text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    plan        text REFERENCES plans (name),
    redact_pii  boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Keys are stored as sha256 digests only; `prefix` is the public start shown in listings.
CREATE TABLE api_keys (
    org_id      text NOT NULL REFERENCES orgs (org_id) ON DELETE CASCADE,
    key_id      text NOT NULL,
    key_hash    bytea NOT NULL,
    prefix      text NOT NULL,
    scopes      text[] NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz,
    PRIMARY KEY (org_id, key_id),
    CHECK (scopes <@ ARRAY['read', 'write']::text[] AND cardinality(scopes) > 0)
);
CREATE UNIQUE INDEX api_keys_key_hash ON api_keys (key_hash);
CREATE UNIQUE INDEX api_keys_key_id ON api_keys (key_id);

CREATE TABLE conversations (
    org_id           text NOT NULL REFERENCES orgs (org_id) ON DELETE CASCADE,
    conversation_id  text NOT NULL,
    title            text,
    agent_id         text,
    tags             text[] NOT NULL DEFAULT '{}',
    metadata         jsonb NOT NULL DEFAULT '{}',
    is_default       boolean NOT NULL DEFAULT false,
    message_count    integer NOT NULL DEFAULT 0,
    -- Bytes of stored content and metadata, kept for plan limits.
    storage_bytes    bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, conversation_id)
);
CREATE UNIQUE INDEX conversations_default ON conversations (org_id) WHERE is_default;
CREATE INDEX conversations_updated ON conversations (org_id, updated_at, conversation_id);
CREATE INDEX conversations_created ON conversations (org_id, created_at, conversation_id);
CREATE INDEX conversations_count ON conversations (org_id, message_count, conversation_id);
CREATE INDEX conversations_agent ON conversations (org_id, agent_id);
CREATE INDEX conversations_tags ON conversations USING gin (tags);

CREATE TABLE messages (
    org_id           text NOT NULL,
    conversation_id  text NOT NULL,
    sequence         integer NOT NULL CHECK (sequence >= 1),
    message_id       text NOT NULL,
    role             text NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    content          text NOT NULL,
    tool_call_id     text,
    tool_name        text,
    metadata         jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, conversation_id, sequence),
    FOREIGN KEY (org_id, conversation_id)
        REFERENCES conversations (org_id, conversation_id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX messages_id ON messages (org_id, message_id);

-- Windows of 5 messages, stride 3. `embedding` is 768 little-endian float32 values, NULL until
-- the indexer has embedded the current `text`; `version` grows on each rebuild so a late
-- embedding of an older text is never stored over a newer one.
CREATE TABLE chunks (
    org_id           text NOT NULL,
    conversation_id  text NOT NULL,
    start_sequence   integer NOT NULL,
    chunk_id         text NOT NULL,
    end_sequence     integer NOT NULL,
    text             text NOT NULL,
    version          integer NOT NULL DEFAULT 1,
    embedding        bytea,
    text_search      tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, conversation_id, start_sequence),
    FOREIGN KEY (org_id, conversation_id)
        REFERENCES conversations (org_id, conversation_id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX chunks_id ON chunks (org_id, chunk_id);
CREATE INDEX chunks_text_search ON chunks USING gin (text_search);
CREATE INDEX chunks_pending ON chunks (org_id) WHERE embedding IS NULL;

-- Work for the indexer: 'upsert' embeds and indexes chunks of a conversation, 'delete' removes
-- a deleted conversation's vectors. No foreign key: delete jobs outlive their conversation.
CREATE TABLE index_outbox (
    job_id           bigserial PRIMARY KEY,
    org_id           text NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('upsert', 'delete')),
    conversation_id  text NOT NULL,
    chunk_ids        text[] NOT NULL DEFAULT '{}',
    attempts         integer NOT NULL DEFAULT 0,
    run_after        timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX index_outbox_due ON index_outbox (run_after, job_id);

CREATE TABLE usage (
    org_id    text NOT NULL REFERENCES orgs (org_id) ON DELETE CASCADE,
    month     date NOT NULL,
    requests  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, month)
);
