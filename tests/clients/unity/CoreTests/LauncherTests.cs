using System;
using System.Diagnostics;
using System.IO;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>SidecarProcess starting the real `xlm-sidecar serve` on the tiny llama.</summary>
    public static class LauncherTests
    {
        public static void Register()
        {
            TestRunner.Add("launcher_starts_a_healthy_daemon_and_stops_it", StartAndStop);
            TestRunner.Add("launcher_says_why_the_daemon_did_not_start", ModelMissing);
            TestRunner.Add("launcher_says_when_the_executable_is_missing", ExecutableMissing);
            TestRunner.Add("launcher_serves_a_unix_socket_with_the_bridge_beside_it", UnixSocket);
        }

        static SidecarLaunchOptions Options(bool frameGuard = false)
        {
            var options = new SidecarLaunchOptions
            {
                ExecutablePath = Env.Get("XLM_TEST_SIDECAR_EXE"),
                ModelPath = Env.Get("XLM_TEST_MODEL"),
                Budget = "0",
                StartTimeout = TimeSpan.FromSeconds(90),
            };
            // One thread: the test machine is small and shared; --profile off skips the one-time
            // machine measurement, which is the planner's business, not the launcher's.
            options.ExtraArguments.AddRange(new[] { "--threads", "1", "--profile", "off" });
            // The frame guard is the frame tests' business. Beside the other test worker it reads that
            // worker's inference as a game's and yields to it: a launcher test took 40-51 s in CI, not 1.
            if (!frameGuard)
                options.ExtraArguments.Add("--no-frame-guard");
            return options;
        }

        static async Task StartAndStop()
        {
            var lines = 0;
            using (var daemon = await SidecarProcess.StartAsync(Options()))
            {
                daemon.LogLine += line => lines++;
                Check.True(daemon.WebSocketAddress.StartsWith("ws://127.0.0.1:"), "the bridge address: " + daemon.WebSocketAddress);
                Check.True(daemon.Token.Length >= 32, "a fresh token of 32+ characters");
                var status = await daemon.Client.GetStatusAsync();
                Check.Equal(EnginePhase.Ready, status.Phase, "phase");
                Check.True(status.Model.Path.EndsWith("tiny_llama.gguf"), "the model asked for: " + status.Model.Path);
                Check.True(status.ListenAddresses.Contains(daemon.WebSocketAddress), "the daemon lists the bridge");
                var reply = await daemon.Client.GenerateAsync(new GenerateRequest { Prompt = "hi", MaxTokens = 3, Sampling = await NoEarlyEnd.Ban(daemon.Client) });
                Check.Equal(3u, reply.Usage.CompletionTokens, "a reply from the launched daemon");
                // The token travelled in the environment and is required.
                using (var stranger = new SidecarClient(daemon.WebSocketAddress, "a-token-from-another-launch"))
                    await Check.Throws<SidecarAuthenticationException>(() => stranger.GetStatusAsync(), "another launch's token");

                var clock = Stopwatch.StartNew();
                var code = await daemon.StopAsync();
                Check.Equal(0, code, "a clean exit on SIGTERM");
                Check.True(clock.Elapsed < TimeSpan.FromSeconds(10), "stopped in " + clock.Elapsed.TotalSeconds + " s");
                Check.True(daemon.HasExited, "HasExited");
                Check.True(daemon.Tail().Contains("\"stopped\""), "the log tail ends with the daemon's own 'stopped'");
                using (var late = new SidecarClient(daemon.WebSocketAddress, daemon.Token))
                    await Check.Throws<SidecarUnavailableException>(() => late.GetStatusAsync(), "a call after the stop");
            }
        }

        static async Task ModelMissing()
        {
            var options = Options();
            options.ModelPath = Path.Combine(Path.GetTempPath(), "no-such-model-" + Guid.NewGuid().ToString("N") + ".gguf");
            var e = await Check.Throws<SidecarLaunchException>(() => SidecarProcess.StartAsync(options), "a missing model");
            Check.Equal((int?)3, e.ExitCode, "exit code for a missing model");
            Check.True(e.Message.Contains("model is missing"), "the message explains: " + e.Message);
            Check.True(e.LogTail.Contains("no-such-model"), "the daemon's own words are attached: " + e.LogTail);
        }

        static async Task ExecutableMissing()
        {
            var options = Options();
            options.ExecutablePath = "/nonexistent/xlm-sidecar";
            var e = await Check.Throws<SidecarLaunchException>(() => SidecarProcess.StartAsync(options), "a missing executable");
            Check.True(e.Message.Contains("/nonexistent/xlm-sidecar"), "the message names the path: " + e.Message);
            Check.Equal((int?)null, e.ExitCode, "no exit code: it never ran");
        }

        static async Task UnixSocket()
        {
            var options = Options();
            var folder = Env.Get("XLM_TEST_TMP");
            options.SocketPath = Path.Combine(folder, "unity-" + Guid.NewGuid().ToString("N").Substring(0, 8) + ".sock");
            using (var daemon = await SidecarProcess.StartAsync(options))
            {
                Check.Equal("unix:" + options.SocketPath, daemon.GrpcAddress, "gRPC on the socket");
                var status = await daemon.Client.GetStatusAsync();
                Check.True(status.ListenAddresses.Contains("unix:" + options.SocketPath), "listed: " + string.Join(", ", status.ListenAddresses));
                Check.Equal(0, await daemon.StopAsync(), "clean exit");
                Check.True(!File.Exists(options.SocketPath), "the socket file is removed on exit");
            }
        }

        /// <summary>A game that starts the daemon and dies without stopping it: the daemon must follow
        /// (--parent-pid). pytest reads the pid and watches the daemon go.</summary>
        public static int LaunchAndCrash()
        {
            var daemon = SidecarProcess.StartAsync(Options(frameGuard: true)).GetAwaiter().GetResult();  // as a game gets it
            Console.WriteLine("DAEMON_PID " + daemon.ProcessId);
            Console.Out.Flush();
            Environment.Exit(17); // no Dispose, no StopAsync: as a crash would leave it
            return 17;
        }
    }
}
