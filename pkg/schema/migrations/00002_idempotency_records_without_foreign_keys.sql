-- +goose Up

-- Every confirm and cancel inserts an idempotency record, and each of its two
-- foreign keys ran a lookup with FOR KEY SHARE on the referenced row in the
-- same transaction: on the owner's row that many sales share, concurrent
-- lockers turn that lock into a MultiXact, and each lock writes WAL. Neither
-- constraint guards anything the schema does not already guarantee: a record
-- is written only by the statement that changes a sale of the same owner and
-- platform in the same transaction (sales references platforms, and
-- export_items, which references owners), and sales rows are never deleted,
-- so a record's owner and platform exist for as long as the record does.
-- The record's scope is still its primary key (owner_id, platform_id,
-- idempotency_key).
ALTER TABLE idempotency_records
    DROP CONSTRAINT IF EXISTS idempotency_records_owner_id_fkey,
    DROP CONSTRAINT IF EXISTS idempotency_records_platform_id_fkey;

-- +goose Down
ALTER TABLE idempotency_records
    ADD CONSTRAINT idempotency_records_owner_id_fkey FOREIGN KEY (owner_id) REFERENCES owners (id),
    ADD CONSTRAINT idempotency_records_platform_id_fkey FOREIGN KEY (platform_id) REFERENCES platforms (id);
