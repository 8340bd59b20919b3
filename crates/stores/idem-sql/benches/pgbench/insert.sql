-- The classic dedup statement: remember a fresh random message id, or do
-- nothing if it was seen. One statement, one commit.
\set k random(1, 9000000000000000000)
INSERT INTO idem_bench_dedup (k) VALUES ('k' || :k) ON CONFLICT DO NOTHING;
