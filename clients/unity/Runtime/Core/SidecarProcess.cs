using System;
using System.Collections.Generic;
using System.ComponentModel;
using System.Diagnostics;
using System.Globalization;
using System.Runtime.InteropServices;
using System.Security.Cryptography;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// A daemon this game started: `xlm-sidecar serve` with the game's budget, port or socket, its
    /// process id (so the daemon exits when the game dies, even in a crash) and a fresh token passed
    /// in the environment (a flag would show in `ps`). StartAsync returns once the daemon has said
    /// "listening" and answered GetStatus; StopAsync or Dispose stop it with the game.
    /// </summary>
    public sealed class SidecarProcess : IDisposable
    {
        const int LogTailLines = 40;

        readonly Process process;
        readonly EventDispatcher dispatcher;
        readonly SidecarLaunchOptions options;
        readonly Queue<string> tail = new Queue<string>();
        readonly TaskCompletionSource<JsonObject> listening =
            new TaskCompletionSource<JsonObject>(TaskCreationOptions.RunContinuationsAsynchronously);
        readonly TaskCompletionSource<int> exited =
            new TaskCompletionSource<int>(TaskCreationOptions.RunContinuationsAsynchronously);
        // The daemon listens first and loads after: "ready" says the model is in and calls are taken.
        readonly TaskCompletionSource<JsonObject> ready =
            new TaskCompletionSource<JsonObject>(TaskCreationOptions.RunContinuationsAsynchronously);

        SidecarProcess(Process process, SidecarLaunchOptions options, string token, EventDispatcher dispatcher)
        {
            this.process = process;
            this.options = options;
            this.dispatcher = dispatcher;
            Token = token;
        }

        /// <summary>A client of this daemon (its events on the context StartAsync was called on).</summary>
        public SidecarClient Client { get; private set; }
        public string Token { get; private set; }
        /// <summary>The WebSocket bridge, "ws://127.0.0.1:port".</summary>
        public string WebSocketAddress { get; private set; }
        /// <summary>The gRPC address, "127.0.0.1:port" or "unix:/path".</summary>
        public string GrpcAddress { get; private set; }
        public int ProcessId { get { return process.Id; } }
        public bool HasExited { get { return exited.Task.IsCompleted; } }
        /// <summary>Completes with the exit code when the daemon exits, for whatever reason.</summary>
        public Task<int> Exit { get { return exited.Task; } }

        /// <summary>Each line the daemon logs (JSON), on the event context.</summary>
        public event Action<string> LogLine;
        /// <summary>The daemon exited (after a successful start), with its exit code, on the event context.</summary>
        public event Action<int> Exited;

        /// <summary>Start the daemon and wait until it is healthy. SidecarLaunchException says why it
        /// could not start (its exit code and last log lines); cancelling kills it.</summary>
        public static async Task<SidecarProcess> StartAsync(SidecarLaunchOptions options,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (options == null)
                throw new ArgumentNullException("options");
            var token = options.Token ?? NewToken();
            if (token.Length < 16)
                throw new ArgumentException("the token needs 16 or more visible ASCII characters", "options");
            var info = new ProcessStartInfo
            {
                FileName = options.ExecutablePath,
                Arguments = JoinArguments(Arguments(options)),
                UseShellExecute = false,
                CreateNoWindow = true,
                RedirectStandardError = true,
                RedirectStandardOutput = true,
                RedirectStandardInput = false,
            };
            if (options.WorkingDirectory != null)
                info.WorkingDirectory = options.WorkingDirectory;
            foreach (var pair in options.Environment)
                info.Environment[pair.Key] = pair.Value;
            info.Environment["XLM_SIDECAR_TOKEN"] = token;

            var process = new Process { StartInfo = info, EnableRaisingEvents = true };
            var daemon = new SidecarProcess(process, options, token, new EventDispatcher(SynchronizationContext.Current));
            process.ErrorDataReceived += (sender, e) => daemon.OnLogLine(e.Data);
            process.OutputDataReceived += (sender, e) => { };
            process.Exited += (sender, e) => daemon.OnExited();
            try
            {
                process.Start();
            }
            catch (Exception e) when (e is Win32Exception || e is InvalidOperationException)
            {
                throw new SidecarLaunchException("cannot start '" + options.ExecutablePath + "': " + e.Message +
                    " (set the executable path to the bundled xlm-sidecar)", null, null, e);
            }
            process.BeginErrorReadLine();
            process.BeginOutputReadLine();
            try
            {
                await daemon.WaitUntilHealthyAsync(cancellationToken).ConfigureAwait(false);
            }
            catch (Exception)
            {
                daemon.Kill();
                throw;
            }
            return daemon;
        }

        async Task WaitUntilHealthyAsync(CancellationToken ct)
        {
            using (var deadline = CancellationTokenSource.CreateLinkedTokenSource(ct))
            {
                deadline.CancelAfter(options.StartTimeout);
                var gaveUp = new TaskCompletionSource<bool>();
                using (deadline.Token.Register(() => gaveUp.TrySetResult(true)))
                {
                    var first = await Task.WhenAny(listening.Task, exited.Task, gaveUp.Task).ConfigureAwait(false);
                    ct.ThrowIfCancellationRequested();
                    if (first == gaveUp.Task)
                        throw new SidecarLaunchException("the daemon did not start listening within " + options.StartTimeout.TotalSeconds + " s", null, Tail());
                    if (first == exited.Task)
                        throw ExitedEarly(exited.Task.Result);
                }
                var line = listening.Task.Result;
                GrpcAddress = line.GetString("address", null);
                WebSocketAddress = line.GetString("ws_address", null);
                if (WebSocketAddress == null)
                    throw new SidecarLaunchException("the daemon serves no WebSocket bridge, which this client speaks (remove --no-websocket / --ws-port -1)", null, Tail());
                Client = new SidecarClient(new WebSocketTransport(WebSocketAddress, Token), dispatcher.Context);
                try
                {
                    // Listening and answering are different things: a call proves the token and the bridge work.
                    await Client.GetStatusAsync(deadline.Token).ConfigureAwait(false);
                }
                catch (Exception e)
                {
                    Client.Dispose();
                    ct.ThrowIfCancellationRequested();
                    throw new SidecarLaunchException("the daemon is listening on " + WebSocketAddress + " but GetStatus failed: " + e.Message, null, Tail(), e);
                }
                // Listening comes before the model is loaded (phase STARTING, then LOADING): the
                // client is handed out once the daemon says "ready", so the game's first line is answered.
                var gaveUpLoading = new TaskCompletionSource<bool>();
                using (deadline.Token.Register(() => gaveUpLoading.TrySetResult(true)))
                {
                    var first = await Task.WhenAny(ready.Task, exited.Task, gaveUpLoading.Task).ConfigureAwait(false);
                    if (first != ready.Task)
                    {
                        Client.Dispose();
                        ct.ThrowIfCancellationRequested();
                        if (first == exited.Task)
                            throw ExitedEarly(exited.Task.Result);
                        throw new SidecarLaunchException("the daemon listens but did not load its model within " + options.StartTimeout.TotalSeconds + " s", null, Tail());
                    }
                }
            }
        }

        SidecarLaunchException ExitedEarly(int code)
        {
            string meaning;
            switch (code)
            {
                case 2: meaning = "bad flags or settings"; break;
                case 3: meaning = "the model is missing, not a GGUF, or truncated"; break;
                case 4: meaning = "it cannot listen: the port or socket is taken"; break;
                default: meaning = "an unexpected failure"; break;
            }
            return new SidecarLaunchException("the daemon exited with code " + code + " before listening: " + meaning, code, Tail());
        }

        void OnLogLine(string line)
        {
            if (line == null)
                return; // end of stream
            lock (tail)
            {
                tail.Enqueue(line);
                while (tail.Count > LogTailLines)
                    tail.Dequeue();
            }
            if (!ready.Task.IsCompleted && line.StartsWith("{", StringComparison.Ordinal))
            {
                try
                {
                    var json = Json.ParseObject(line);
                    if (json.GetString("event") == "listening")
                        listening.TrySetResult(json);
                    else if (json.GetString("event") == "ready")
                        ready.TrySetResult(json);
                }
                catch (FormatException)
                {
                    // Not one of the daemon's JSON lines (llama.cpp may print too).
                }
            }
            var handler = LogLine;
            if (handler != null)
                dispatcher.Post(() => handler(line));
        }

        void OnExited()
        {
            // Waiting once more drains the redirected streams, so the tail holds the last words.
            try
            {
                process.WaitForExit();
            }
            catch (Exception)
            {
                // Only flushes the log tail; the exit itself is known.
            }
            var code = process.ExitCode;
            var wasRunning = listening.Task.IsCompleted;
            exited.TrySetResult(code);
            var handler = Exited;
            if (wasRunning && handler != null)
                dispatcher.Post(() => handler(code));
        }

        /// <summary>The daemon's last log lines.</summary>
        public string Tail()
        {
            lock (tail)
                return string.Join("\n", tail.ToArray());
        }

        /// <summary>Stop the daemon: SIGTERM (calls in flight get the grace time), then kill. Returns its exit code.</summary>
        public async Task<int> StopAsync()
        {
            if (Client != null)
                Client.Dispose();
            if (!HasExited)
            {
                var gentle = Posix.Terminate(process.Id);
                var timeout = gentle ? options.StopGrace + TimeSpan.FromSeconds(3) : TimeSpan.Zero;
                var done = await Task.WhenAny(exited.Task, Task.Delay(timeout)).ConfigureAwait(false);
                if (done != exited.Task)
                    Kill();
            }
            return await exited.Task.ConfigureAwait(false);
        }

        /// <summary>Stops the daemon without waiting long: the game is going.</summary>
        public void Dispose()
        {
            if (Client != null)
                Client.Dispose();
            if (!HasExited && Posix.Terminate(process.Id))
            {
                // With the client gone no call is in flight, so draining is quick.
                if (exited.Task.Wait(TimeSpan.FromSeconds(3)))
                    return;
            }
            Kill();
        }

        void Kill()
        {
            try
            {
                if (!process.HasExited)
                    process.Kill();
            }
            catch (InvalidOperationException)
            {
                // It exited on its own meanwhile.
            }
            catch (Win32Exception)
            {
                // It is exiting already.
            }
        }

        static List<string> Arguments(SidecarLaunchOptions o)
        {
            var args = new List<string> { "serve", "--log-format", "json", "--budget", o.Budget ?? "0" };
            if (o.SocketPath != null)
            {
                args.Add("--socket");
                args.Add(o.SocketPath);
                // The bridge is off by default with a socket; this client needs it.
                args.Add("--ws-port");
                args.Add(Invariant(o.WebSocketPort ?? 0));
            }
            else
            {
                args.Add("--port");
                args.Add(Invariant(o.Port));
                if (o.WebSocketPort.HasValue)
                {
                    args.Add("--ws-port");
                    args.Add(Invariant(o.WebSocketPort.Value));
                }
            }
            if (o.ModelPath != null)
            {
                args.Add("--model");
                args.Add(o.ModelPath);
            }
            if (o.ProjectorPath != null)
            {
                args.Add("--mmproj");
                args.Add(o.ProjectorPath);
            }
            if (o.MaxCpuThreads.HasValue)
            {
                args.Add("--max-cpu-threads");
                args.Add(Invariant(o.MaxCpuThreads.Value));
            }
            args.Add("--parent-pid");
            args.Add(Invariant(o.ParentProcessId != 0 ? o.ParentProcessId : Process.GetCurrentProcess().Id));
            args.Add("--grace-seconds");
            args.Add(o.StopGrace.TotalSeconds.ToString("0.###", CultureInfo.InvariantCulture));
            args.AddRange(o.ExtraArguments);
            return args;
        }

        static string Invariant(int value)
        {
            return value.ToString(CultureInfo.InvariantCulture);
        }

        /// <summary>One command line from arguments, quoted the way .NET and the MSVC runtime split it
        /// (ProcessStartInfo.ArgumentList is not in Unity's profile).</summary>
        public static string JoinArguments(IEnumerable<string> args)
        {
            var b = new StringBuilder();
            foreach (var arg in args)
            {
                if (b.Length > 0)
                    b.Append(' ');
                if (arg.Length > 0 && arg.IndexOfAny(new[] { ' ', '\t', '\n', '"' }) < 0)
                {
                    b.Append(arg);
                    continue;
                }
                b.Append('"');
                var backslashes = 0;
                foreach (var c in arg)
                {
                    if (c == '\\')
                    {
                        backslashes++;
                        continue;
                    }
                    // Backslashes are literal unless they precede a quote: then each is doubled.
                    b.Append('\\', c == '"' ? backslashes * 2 + 1 : backslashes);
                    backslashes = 0;
                    b.Append(c);
                }
                b.Append('\\', backslashes * 2);
                b.Append('"');
            }
            return b.ToString();
        }

        static string NewToken()
        {
            var bytes = new byte[24];
            using (var random = RandomNumberGenerator.Create())
                random.GetBytes(bytes);
            return Convert.ToBase64String(bytes).TrimEnd('=').Replace('+', '-').Replace('/', '_');
        }

        /// <summary>SIGTERM, which .NET's Process cannot send: the daemon drains and removes its token file.</summary>
        static class Posix
        {
            const int SIGTERM = 15;

            [DllImport("libc.so.6", EntryPoint = "kill", SetLastError = true)]
            static extern int KillGlibc(int pid, int signal);

            [DllImport("libc", EntryPoint = "kill", SetLastError = true)]
            static extern int KillLibc(int pid, int signal);

            /// <summary>False where there are no signals (Windows): the caller kills instead.</summary>
            public static bool Terminate(int pid)
            {
                if (RuntimeInformation.IsOSPlatform(OSPlatform.Windows))
                    return false;
                try
                {
                    return KillGlibc(pid, SIGTERM) == 0;
                }
                catch (DllNotFoundException) { }
                catch (EntryPointNotFoundException) { }
                try
                {
                    return KillLibc(pid, SIGTERM) == 0;
                }
                catch (DllNotFoundException) { }
                catch (EntryPointNotFoundException) { }
                return false;
            }
        }
    }
}
