-- The classic dedup statement, 256 fresh random message ids a statement
-- (one commit for all of them).
INSERT INTO idem_bench_dedup (k)
SELECT 'k' || (random() * 9e18)::int8 FROM generate_series(1, 256)
ON CONFLICT DO NOTHING;
