-- +goose Up

-- A refused call's answer becomes final for its Idempotency-Key, as a 200
-- is: the identical request sent again is answered the same refusal
-- instead of running again. Before, it ran again and could succeed once the
-- cause had gone, and so could a copy of the request still in flight (an
-- attempt the platform had given up on, delivered late): a fault-injection
-- drill through the gateway saw a confirm answered 409 item_already_sold
-- to its retry, and its first attempt, arriving 3 s late after the other
-- platform's cancel, sold the item to an order the platform had been told
-- was not sold (sales-writer README, "What is stored"). refusal is the
-- error code answered (sales.refusalCodes); NULL in a binding written by
-- an older build, which runs again as before until it expires.
ALTER TABLE idempotency_refusals ADD COLUMN refusal text;

-- +goose Down
ALTER TABLE idempotency_refusals DROP COLUMN refusal;
