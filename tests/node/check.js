// node-postgres (pg) as a client of dpproxy, for tests/test_client_node.py.
//
// Usage: node check.js HOST PORT DATABASE USER PASSWORD
// Prints one JSON object: what introspection found and the DP answers it got, through
// the simple protocol (query(text)), unnamed extended (query(text, values)), a named
// statement run twice, a transaction, a pool, and a refused query.
'use strict';

const { Client, Pool } = require('pg');

async function main() {
  const [host, port, database, user, password] = process.argv.slice(2);
  const config = { host, port: Number(port), database, user, password, connectionTimeoutMillis: 10000 };
  const out = {};
  const client = new Client(config);
  await client.connect();

  const tables = await client.query(
    "SELECT table_schema, table_name FROM information_schema.tables " +
    "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2");
  out.tables = tables.rows.map((r) => r.table_name);
  const columns = await client.query(
    'SELECT column_name, data_type FROM information_schema.columns ' +
    'WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position', ['public', 'adult']);
  out.columns = columns.rows.map((r) => `${r.column_name} ${r.data_type}`);
  const types = await client.query('SELECT oid, typname FROM pg_catalog.pg_type WHERE typname = ANY($1)',
    [['int8', 'numeric']]);
  out.types = types.rows.map((r) => r.typname).sort();

  out.simple = (await client.query('SELECT COUNT(*) FROM adult WHERE age > 30')).rows[0].count;
  out.extended = (await client.query('SELECT COUNT(*) FROM adult WHERE age > $1', [30])).rows[0].count;
  out.named = [];
  for (let i = 0; i < 2; i++) {
    const named = await client.query({ name: 'count_over', text: 'SELECT COUNT(*) FROM adult WHERE age > $1', values: [30] });
    out.named.push(named.rows[0].count);
  }

  await client.query('BEGIN');
  out.transaction = (await client.query('SELECT COUNT(*) FROM adult WHERE sex = $1', ['Female'])).rows[0].count;
  await client.query('COMMIT');

  try {
    await client.query('SELECT age FROM adult');
    out.refused = null;
  } catch (err) {
    out.refused = err.code;
  }
  out.after_refusal = (await client.query('SELECT 1 AS one')).rows[0].one;
  await client.end();

  const pool = new Pool({ ...config, max: 3 });
  const answers = await Promise.all([1, 2, 3, 4, 5, 6].map(
    () => pool.query('SELECT COUNT(*) FROM adult WHERE age < $1', [30])));
  out.pool = answers.map((r) => r.rows[0].count);
  await pool.end();

  console.log(JSON.stringify(out));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
