-- Decision records gained the path 'shed' (decisionpb PATH_SHED = 8):
-- priority load shedding refused the request before any rule was checked.
-- Adding a value to an Enum8 is a metadata change (ClickHouse 18.16 and
-- current alike); rows already written keep their values.
ALTER TABLE decisions MODIFY COLUMN decision_path Enum8('unspecified' = 0, 'redis' = 1, 'deny_cache' = 2, 'lease' = 3, 'fallback' = 4, 'blocked' = 5, 'no_share' = 6, 'local' = 7, 'shed' = 8);
