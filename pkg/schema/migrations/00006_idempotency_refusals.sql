-- +goose Up

-- Spec 4.7 rule 3: reusing an Idempotency-Key for a different request gives
-- 409, whatever the outcome of the key's first request. A refused call (404,
-- 409) stores no result in idempotency_records: the identical request may be
-- sent again once its cause is gone, and then it executes (sales-writer
-- README, "What is stored"). Its key stays bound to it all the same: this
-- table keeps the fingerprint of the first refused request of a key, and the
-- sale statements change nothing for a request with another fingerprint,
-- which is then answered idempotency_conflict. Same scope and retention as
-- idempotency_records, and no foreign keys, for the reason of 00002.
CREATE TABLE idempotency_refusals (
    owner_id        uuid NOT NULL,
    platform_id     text NOT NULL,
    idempotency_key idempotency_key NOT NULL,
    fingerprint     bytea NOT NULL,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (owner_id, platform_id, idempotency_key)
);
CREATE INDEX idempotency_refusals_expiry_idx ON idempotency_refusals (expires_at);

-- +goose Down
DROP TABLE idempotency_refusals;
