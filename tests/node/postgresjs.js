// postgres.js (porsager's `postgres` package) as a client of dpproxy, for tests/test_client_postgresjs.py.
//
// Usage: node postgresjs.js HOST PORT DATABASE USER PASSWORD
// Prints one JSON object: what introspection found, the DP answers (named prepared statements
// with bound parameters, a pipeline of several statements on one connection, a cursor, a
// transaction, the simple protocol), the spent ε read back after each, and a refused row read.
'use strict';

const postgres = require('postgres');

async function spent(sql) {
  const [row] = await sql`SHOW dpproxy.budget`;
  return Number(row.spent_epsilon);
}

async function main() {
  const [host, port, database, username, password] = process.argv.slice(2);
  // max: 1, so that the pipeline below shares one connection; no notices on stdout.
  const sql = postgres({ host, port: Number(port), database, username, password, max: 1,
                         connect_timeout: 10, idle_timeout: 5, onnotice: () => {} });
  const out = { charges: {} };

  const tables = await sql`SELECT table_name FROM information_schema.tables
                           WHERE table_schema = ${'public'} ORDER BY 1`;
  out.tables = tables.map((r) => r.table_name);
  const columns = await sql`SELECT column_name, data_type FROM information_schema.columns
                            WHERE table_schema = ${'public'} AND table_name = ${'adult'} ORDER BY ordinal_position`;
  out.columns = columns.map((r) => `${r.column_name} ${r.data_type}`);

  async function charged(name, query) {
    const before = await spent(sql);
    const rows = await query();
    out.charges[name] = (await spent(sql)) - before;
    return rows;
  }
  out.count = (await charged('count', () => sql`SELECT COUNT(*) AS n FROM adult WHERE age > ${30}`))[0].n;
  out.sum = (await charged('sum', () => sql`SELECT SUM(capital_gain) AS s FROM adult WHERE sex = ${'Female'}`))[0].s;
  out.avg = (await charged('avg', () => sql`SELECT AVG(age) AS a FROM adult WHERE age > ${30}`))[0].a;
  out.histogram = (await charged('histogram', () => sql`SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex`))
    .map((r) => [r.sex, r.n]);
  // The same named statement again, now prepared on the connection: Bind/Execute only.
  out.again = (await charged('again', () => sql`SELECT COUNT(*) AS n FROM adult WHERE age > ${30}`))[0].n;
  // Unprepared (unnamed statement), as with prepare: false.
  out.unnamed = (await charged('unnamed', () => sql.unsafe('SELECT COUNT(*) AS n FROM adult WHERE age > $1', [30],
                                                           { prepare: false })))[0].n;

  // A pipeline: three statements issued together on the one connection. The first time each is
  // parsed and described (its parameter types) before its Bind; the second time, prepared, all
  // three Bind/Execute/Sync go out before any answer is read.
  out.pipeline = [];
  out.charges.pipeline = [];
  for (let round = 0; round < 2; round++) {
    const before = await spent(sql);
    const piped = await Promise.all([
      sql`SELECT COUNT(*) AS n FROM adult WHERE age < ${30}`,
      sql`SELECT COUNT(*) AS n FROM adult WHERE age >= ${30} AND age < ${50}`,
      sql`SELECT 1 AS one`,
    ]);
    out.pipeline.push(piped.map((rows) => rows[0].n ?? rows[0].one));
    out.charges.pipeline.push((await spent(sql)) - before);
  }

  // A cursor of one row at a time: Execute with a row limit and Flush, the portal suspended
  // between the histogram's rows; the release is charged once.
  out.cursor = [];
  const beforeCursor = await spent(sql);
  for await (const rows of sql`SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex ORDER BY sex`.cursor(1)) {
    out.cursor.push(rows.map((r) => [r.sex, r.n]));
  }
  out.charges.cursor = (await spent(sql)) - beforeCursor;
  // sql.begin: a simple Query 'begin', the statements, then 'commit' as a prepared statement.
  out.transaction = (await charged('transaction', () => sql.begin(
    async (tx) => tx`SELECT COUNT(*) AS n FROM adult WHERE sex = ${'Female'}`)))[0].n;
  // .simple(): the simple protocol, two statements in one Query.
  const simple = await charged('simple', () => sql`SELECT COUNT(*) AS n FROM adult WHERE age > 60; SELECT 2 AS two`.simple());
  out.simple = [simple[0][0].n, simple[1][0].two];

  const beforeRefusal = await spent(sql);
  try {
    await sql`SELECT age FROM adult WHERE age > ${30}`;
    out.refused = null;
  } catch (err) {
    out.refused = { name: err.name, code: err.code, message: err.message, hint: err.hint };
  }
  out.charges.refused = (await spent(sql)) - beforeRefusal;
  out.after_refusal = (await sql`SELECT 1 AS one`)[0].one;
  await sql.end();
  console.log(JSON.stringify(out));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
