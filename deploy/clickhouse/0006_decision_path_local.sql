-- Decision records gained the path 'local' (decisionpb PATH_LOCAL = 7): only
-- local-scope rules matched, or one of them denied, and the enforcer decided
-- in its own memory without a Redis call. Adding a value to an Enum8 is a
-- metadata change (ClickHouse 18.16 and current alike); rows already written
-- keep their values.
ALTER TABLE decisions MODIFY COLUMN decision_path Enum8('unspecified' = 0, 'redis' = 1, 'deny_cache' = 2, 'lease' = 3, 'fallback' = 4, 'blocked' = 5, 'no_share' = 6, 'local' = 7);
