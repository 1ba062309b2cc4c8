import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;

/**
 * pgjdbc through dpproxy with TLS: args host port database user password negotiation
 * (sslNegotiation: "direct" or "postgres"). Prints "DRIVER version", "COUNT n" for one DP count,
 * then "DONE ok".
 */
public final class DirectTlsCheck {
    private DirectTlsCheck() {
    }

    public static void main(String[] args) throws SQLException {
        System.out.println("DRIVER " + org.postgresql.util.DriverInfo.DRIVER_VERSION);
        String url = "jdbc:postgresql://" + args[0] + ":" + args[1] + "/" + args[2];
        Properties props = new Properties();
        props.setProperty("user", args[3]);
        props.setProperty("password", args[4]);
        props.setProperty("sslmode", "require"); // encrypted, certificate not verified (a test's self-signed one)
        props.setProperty("sslNegotiation", args[5]);
        props.setProperty("connectTimeout", "10");
        try (Connection conn = DriverManager.getConnection(url, props);
                Statement st = conn.createStatement();
                ResultSet rs = st.executeQuery("SELECT COUNT(*) FROM adult WHERE age > 40")) {
            rs.next();
            System.out.println("COUNT " + rs.getLong(1));
        }
        System.out.println("DONE ok");
    }
}
