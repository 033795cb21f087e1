-- SQLite's text of the fragments several statements are built from.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a ? parameter.

-- name: true
1

-- name: status_in
status IN ({states})

-- name: assign
{column} = ?

-- name: guard_term
AND {column} IS ?

-- name: and_in_list
AND {column} IN ({marks})

-- name: where
WHERE 1 {terms}
