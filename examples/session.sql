-- The psql session of the README. Against `dpproxy demo` (or `docker compose up`), with a fresh ledger:
--   PGPASSWORD=analyst psql -X -e "host=127.0.0.1 port=6432 dbname=demo user=analyst" -f examples/session.sql
-- prints the README's statements, notices and errors (the noised values differ from run to run).
SELECT COUNT(*) FROM adult WHERE age > 40;
SELECT COUNT(*), SUM(hours_per_week) FROM adult WHERE age > 200;
SELECT AVG(age), MIN(hours_per_week), MAX(age) FROM adult WHERE sex = 'Female';
SELECT MODE() WITHIN GROUP (ORDER BY race) FROM adult WHERE education_num >= 13;
SELECT * FROM adult;
SELECT sex, COUNT(*), AVG(hours_per_week) FROM adult GROUP BY sex;
SELECT date_trunc('month', interview_date) AS month, COUNT(*) FROM adult WHERE interview_date >= '2024-01-01' AND interview_date < '2024-04-01' GROUP BY 1 ORDER BY 1;
SELECT education, COUNT(*) FROM adult GROUP BY education;
SET dpproxy.epsilon = 0.1;
SELECT COUNT(*) FROM adult WHERE workclass = 'Private';
SHOW dpproxy.budget;
\dt
