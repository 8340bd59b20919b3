-- The classic dedup statement, one delivery of the side-by-side stream a
-- transaction: remember the key, or do nothing if it was seen. Each client
-- counts its deliveries in :j (pgbench -D j=0); every eleventh delivery
-- repeats the key of ten deliveries before, so 1 in 11 is a duplicate, as
-- in idem's stream.
\set j :j + 1
\set k :client_id * 1000000000 + :j
\if :j % 11 = 0
\set k :k - 10
\endif
INSERT INTO idem_sbs_dedup (k) VALUES ('order-' || :k) ON CONFLICT DO NOTHING;
