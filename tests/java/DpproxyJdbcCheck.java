import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

/**
 * What a JDBC application does through dpproxy, printed one fact per line as "KEY value"
 * for tests/test_client_jdbc.py to check.
 *
 * Usage: java -cp pgjdbc.jar:. DpproxyJdbcCheck HOST PORT DATABASE USER PASSWORD
 *
 * Connects with prepareThreshold=1 (the first execution of a PreparedStatement already
 * uses a named server statement; later ones Bind it again and ask for binary results),
 * calls DatabaseMetaData, runs DP aggregates through Statement and PreparedStatement,
 * inside and outside a transaction, and tries one query dpproxy must refuse.
 */
public final class DpproxyJdbcCheck {
    private DpproxyJdbcCheck() {}

    public static void main(String[] args) throws SQLException {
        String url = "jdbc:postgresql://" + args[0] + ":" + args[1] + "/" + args[2];
        Properties props = new Properties();
        props.setProperty("user", args[3]);
        props.setProperty("password", args[4]);
        props.setProperty("prepareThreshold", "1");
        props.setProperty("connectTimeout", "10");
        try (Connection conn = DriverManager.getConnection(url, props)) {
            metadata(conn.getMetaData());
            statement(conn);
            prepared(conn);
            transaction(conn);
            fetchSize(conn);
            fetchSizeEarlyClose(conn);
            refusal(conn);
            refusalInBlock(conn);
            failedBatch(conn);
        }
        System.out.println("DONE ok");
    }

    private static void metadata(DatabaseMetaData meta) throws SQLException {
        System.out.println("PRODUCT " + meta.getDatabaseProductVersion());
        try (ResultSet rs = meta.getTables(null, "public", "%", new String[] {"TABLE"})) {
            while (rs.next()) {
                System.out.println("TABLE " + rs.getString("TABLE_NAME"));
            }
        }
        try (ResultSet rs = meta.getColumns(null, "public", "adult", "%")) {
            while (rs.next()) {
                System.out.println("COLUMN " + rs.getString("COLUMN_NAME") + " " + rs.getString("TYPE_NAME"));
            }
        }
        try (ResultSet rs = meta.getPrimaryKeys(null, "public", "lookup")) {
            while (rs.next()) {
                System.out.println("PRIMARY_KEY " + rs.getString("COLUMN_NAME"));
            }
        }
        try (ResultSet rs = meta.getIndexInfo(null, "public", "adult", false, false)) {
            while (rs.next()) {
                System.out.println("INDEX " + rs.getString("INDEX_NAME") + " " + rs.getString("COLUMN_NAME")
                        + " " + rs.getLong("CARDINALITY") + " " + rs.getLong("PAGES"));
            }
        }
        int types = 0;
        try (ResultSet rs = meta.getTypeInfo()) {
            while (rs.next()) {
                types++;
            }
        }
        System.out.println("TYPES " + types);
    }

    private static void statement(Connection conn) throws SQLException {
        try (Statement st = conn.createStatement();
                ResultSet rs = st.executeQuery("SELECT COUNT(*) FROM adult WHERE age > 30")) {
            rs.next();
            System.out.println("STATEMENT_COUNT " + rs.getLong(1));
            System.out.println("STATEMENT_TYPE " + rs.getMetaData().getColumnTypeName(1));
        }
    }

    private static void prepared(Connection conn) throws SQLException {
        String sql = "SELECT COUNT(*), SUM(capital_gain) FROM adult WHERE age > ?";
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            for (int i = 0; i < 4; i++) { // later executions re-Bind S_1 with binary int8/numeric results
                ps.setInt(1, 30);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    System.out.println("PREPARED " + rs.getLong(1) + " " + rs.getBigDecimal(2));
                }
            }
        }
    }

    private static void transaction(Connection conn) throws SQLException {
        conn.setAutoCommit(false);
        try (PreparedStatement ps = conn.prepareStatement("SELECT COUNT(*) FROM adult WHERE sex = ?")) {
            ps.setString(1, "Female");
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                System.out.println("TRANSACTION_COUNT " + rs.getLong(1));
            }
        }
        conn.commit();
        conn.setAutoCommit(true);
        System.out.println("COMMITTED ok");
    }

    /** A large result read 500 rows at a time (row-limited Execute), a DP query in between. */
    private static void fetchSize(Connection conn) throws SQLException {
        conn.setAutoCommit(false);
        long rows = 0;
        long sum = 0;
        try (Statement st = conn.createStatement()) {
            st.setFetchSize(500);
            try (ResultSet rs = st.executeQuery("SELECT g, g::text FROM generate_series(1, 200000) g")) {
                while (rs.next()) {
                    rows++;
                    sum += rs.getLong(1);
                    if (rows == 1000) {
                        try (Statement dp = conn.createStatement();
                             ResultSet count = dp.executeQuery("SELECT COUNT(*) FROM adult")) {
                            count.next();
                            System.out.println("FETCH_BETWEEN " + count.getLong(1));
                        }
                    }
                }
            }
        }
        conn.commit();
        conn.setAutoCommit(true);
        System.out.println("FETCHED " + rows + " " + sum);
    }

    /** A large result read 100 rows at a time and closed early in a block, then COMMIT: as on
     *  PostgreSQL, the rows never read are never computed (the millionth would fail the block,
     *  a division by zero, and its COMMIT would roll the SET before it back). */
    private static void fetchSizeEarlyClose(Connection conn) throws SQLException {
        conn.setAutoCommit(false);
        long rows = 0;
        try (Statement st = conn.createStatement()) {
            st.execute("SET application_name = 'early_close_committed'");
            st.setFetchSize(100);
            try (ResultSet rs = st.executeQuery(
                    "SELECT 1 / (g - 1000000) FROM (SELECT pg_catalog.generate_series(1, 2000000) AS g) s")) {
                while (rows < 150 && rs.next()) {
                    rows++;
                }
            }
        }
        conn.commit();
        conn.setAutoCommit(true);
        System.out.println("EARLY_CLOSED " + rows + " " + show(conn, "application_name"));
        try (Statement st = conn.createStatement()) {
            st.execute("RESET application_name");
        }
    }

    /** A batch (autocommit: every statement, then one Sync) whose last statement fails: as on
     *  PostgreSQL, the SET before it is rolled back with it. */
    private static void failedBatch(Connection conn) throws SQLException {
        String before = show(conn, "TimeZone");
        try (Statement st = conn.createStatement()) {
            st.addBatch("SET TimeZone = 'Asia/Tokyo'");
            st.addBatch("SET DateStyle = 'German'");
            st.addBatch("SET TimeZone = 'no such zone'");
            st.executeBatch();
            System.out.println("BATCH_FAILED none");
        } catch (SQLException e) {
            SQLException cause = e.getNextException() != null ? e.getNextException() : e;
            System.out.println("BATCH_FAILED " + cause.getSQLState());
        }
        System.out.println("BATCH_UNDONE " + before.equals(show(conn, "TimeZone")) + " " + show(conn, "DateStyle"));
    }

    private static String show(Connection conn, String setting) throws SQLException {
        try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SHOW " + setting)) {
            rs.next();
            return rs.getString(1);
        }
    }

    /** A refusal with autocommit off fails the transaction, as any error does on PostgreSQL. */
    private static void refusalInBlock(Connection conn) throws SQLException {
        conn.setAutoCommit(false);
        try (Statement st = conn.createStatement()) {
            st.executeQuery("SELECT age FROM adult");
        } catch (SQLException e) {
            System.out.println("BLOCK_REFUSED " + e.getSQLState());
        }
        try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT 1")) {
            rs.next();
            System.out.println("BLOCK_AFTER_REFUSAL " + rs.getInt(1));
        } catch (SQLException e) {
            System.out.println("BLOCK_AFTER_REFUSAL " + e.getSQLState());
        }
        try {
            conn.commit();
            System.out.println("BLOCK_COMMIT ok");
        } catch (SQLException e) {
            System.out.println("BLOCK_COMMIT " + e.getSQLState());
        }
        conn.setAutoCommit(true);
    }

    private static void refusal(Connection conn) throws SQLException {
        List<String> states = new ArrayList<>();
        try (Statement st = conn.createStatement()) {
            st.executeQuery("SELECT age FROM adult");
        } catch (SQLException e) {
            states.add(e.getSQLState());
        }
        System.out.println("REFUSED " + String.join(",", states));
        try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT 1")) {
            rs.next();
            System.out.println("AFTER_REFUSAL " + rs.getInt(1));
        }
    }
}
