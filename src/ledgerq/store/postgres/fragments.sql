-- PostgreSQL's text of the fragments several statements are built from.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

-- name: true
TRUE

-- name: status_in
status IN ({states})

-- name: assign
{column} = %s

-- name: guard_term
AND {column} IS NOT DISTINCT FROM %s

-- name: and_in_list
AND {column} IN ({marks})

-- name: where
WHERE TRUE {terms}
