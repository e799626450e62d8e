// The launcher of `rlpulse search up`: one OpenSearch node in this JVM, with the plugins that
// the Maven jars next to it provide (HTTP and transport over Netty, Painless scripts, the
// common analyzers). rlpulse compiles it with javac at first use (rlpulse/local/opensearch.py).
//
// Usage: java -cp 'jars/*:classes' RlpulseNode HOME
// HOME holds config/opensearch.yml (written by rlpulse); data, logs and the port are set there.
// SIGTERM closes the node (a shutdown hook) and the JVM exits.

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.painless.PainlessPlugin;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

public final class RlpulseNode extends Node {
    private static final List<Class<? extends Plugin>> PLUGINS =
        List.of(Netty4Plugin.class, PainlessPlugin.class, CommonAnalysisPlugin.class);

    private RlpulseNode(Environment environment, Collection<Class<? extends Plugin>> plugins) {
        super(environment, plugins, true);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: RlpulseNode HOME");
            System.exit(2);
        }
        Path home = Paths.get(args[0]).toAbsolutePath();
        Settings given = Settings.builder().put("path.home", home.toString()).build();
        Environment environment = InternalSettingsPreparer.prepareEnvironment(
            given, Collections.emptyMap(), home.resolve("config"), () -> "rlpulse-search");
        RlpulseNode node = new RlpulseNode(environment, PLUGINS);
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(20, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                closed.countDown();
            }
        }, "rlpulse-node-shutdown"));
        node.start();
        closed.await();
    }
}
