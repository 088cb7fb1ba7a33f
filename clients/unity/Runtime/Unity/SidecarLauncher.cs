using System;
using System.IO;
using System.Threading;
using System.Threading.Tasks;
using UnityEngine;

namespace Xlm.Sidecar.Unity
{
    /// <summary>
    /// Starts `xlm-sidecar` beside the game (or attaches to one already running), waits until it is
    /// healthy and stops it with the game. The daemon also watches the game's process id, so it
    /// exits by itself when the game crashes. Other components find it through WhenReady.
    /// </summary>
    [DisallowMultipleComponent]
    [AddComponentMenu("XLM Sidecar/Sidecar Launcher")]
    public sealed class SidecarLauncher : MonoBehaviour
    {
        [Header("Daemon")]
        [Tooltip("The xlm-sidecar executable. Empty: StreamingAssets/xlm-sidecar/xlm-sidecar(.exe) if it is there, else xlm-sidecar on PATH.")]
        [SerializeField] string executablePath = "";
        [Tooltip("A GGUF model. Empty: the daemon's bundled default.")]
        [SerializeField] string modelPath = "";
        [Tooltip("A vision projector GGUF (mmproj) for screenshot questions. Empty: none.")]
        [SerializeField] string projectorPath = "";
        [Tooltip("VRAM the game grants at start: 512M, 3G, 0 = CPU only. VramBudget changes it later.")]
        [SerializeField] string budget = "2G";
        [Tooltip("Most CPU threads per forward pass; 0 leaves the daemon's default.")]
        [SerializeField] int maxCpuThreads = 0;
        [Tooltip("gRPC port; 0 picks a free one. The WebSocket bridge this client uses takes the next one.")]
        [SerializeField] int port = 0;
        [Tooltip("Serve gRPC on this Unix socket instead (macOS, Linux). The bridge then takes a free loopback port.")]
        [SerializeField] string socketPath = "";
        [SerializeField] float startTimeoutSeconds = 180f;
        [Tooltip("More serve flags, one argument per entry (e.g. --ctx, 8192).")]
        [SerializeField] string[] extraArguments = new string[0];

        [Header("Or attach to a daemon already running")]
        [Tooltip("Its WebSocket address, e.g. ws://127.0.0.1:50552. Empty: launch one.")]
        [SerializeField] string attachAddress = "";
        [Tooltip("Its token. Empty: XLM_SIDECAR_TOKEN from the environment.")]
        [SerializeField] string attachToken = "";

        [Header("Lifetime")]
        [SerializeField] bool launchOnAwake = true;
        [SerializeField] bool keepAcrossScenes = true;
        [Tooltip("Copy the daemon's warnings and errors into the Unity log.")]
        [SerializeField] bool forwardDaemonWarnings = true;

        [Header("Frame reports")]
        [Tooltip("Send the game's frame times (Time.unscaledDeltaTime) to the daemon, so its frame-time guard keeps out of the frames' way.")]
        [SerializeField] bool reportFrames = true;
        [Tooltip("Seconds of frames each report covers.")]
        [SerializeField] float frameReportInterval = 1f;
        [Tooltip("The frame rate the game aims at, for the frame budget; 0: Application.targetFrameRate, or 60 when that is unset.")]
        [SerializeField] int targetFrameRate = 0;

        Task<SidecarClient> launch;
        SidecarProcess process;
        // Cancelled when the component goes, so a launch still loading the model is killed, not orphaned
        // (in the editor the parent process, the editor, lives on).
        readonly CancellationTokenSource lifetime = new CancellationTokenSource();
        FrameReporter frames;

        public string ExecutablePath { get { return executablePath; } set { executablePath = value; } }
        public string ModelPath { get { return modelPath; } set { modelPath = value; } }
        public string ProjectorPath { get { return projectorPath; } set { projectorPath = value; } }
        public string Budget { get { return budget; } set { budget = value; } }
        public int Port { get { return port; } set { port = value; } }
        public string SocketPath { get { return socketPath; } set { socketPath = value; } }
        public string AttachAddress { get { return attachAddress; } set { attachAddress = value; } }
        public string AttachToken { get { return attachToken; } set { attachToken = value; } }
        public bool LaunchOnAwake { get { return launchOnAwake; } set { launchOnAwake = value; } }
        public string[] ExtraArguments { get { return extraArguments; } set { extraArguments = value ?? new string[0]; } }
        /// <summary>Whether the game's frame times go to the daemon (on by default).</summary>
        public bool ReportFrames { get { return reportFrames; } set { reportFrames = value; } }
        public float FrameReportInterval { get { return frameReportInterval; } set { frameReportInterval = value; } }
        public int TargetFrameRate { get { return targetFrameRate; } set { targetFrameRate = value; } }
        /// <summary>What sends the frame reports, once connected and reporting (else null).</summary>
        public FrameReporter FrameReporter { get { return frames; } }
        /// <summary>The daemon's answer to the last frame report: what its frame-time guard does now.</summary>
        public FrameGuardState FrameGuard { get { return frames != null ? frames.Guard : null; } }

        /// <summary>The client, once ready; null before.</summary>
        public SidecarClient Client { get; private set; }
        public bool IsReady { get { return Client != null; } }
        /// <summary>The daemon this component started (null when attached to one).</summary>
        public SidecarProcess Process { get { return process; } }

        /// <summary>On the main thread, once the daemon answers.</summary>
        public event Action<SidecarClient> Ready;
        /// <summary>On the main thread, when the daemon could not be started or reached.</summary>
        public event Action<Exception> Failed;
        /// <summary>On the main thread, when a daemon this component started exits on its own.</summary>
        public event Action<int> DaemonExited;

        /// <summary>The client once the daemon is healthy; starts it if nothing has yet.</summary>
        public Task<SidecarClient> WhenReady { get { return Launch(); } }

        /// <summary>The launcher assigned in the inspector, or the scene's.</summary>
        public static SidecarLauncher Find(SidecarLauncher assigned)
        {
            var launcher = assigned != null ? assigned : FindObjectOfType<SidecarLauncher>();
            if (launcher == null)
                throw new InvalidOperationException("no SidecarLauncher in the scene: add one (XLM Sidecar/Sidecar Launcher)");
            return launcher;
        }

        void Awake()
        {
            if (keepAcrossScenes)
                DontDestroyOnLoad(gameObject);
            if (launchOnAwake)
                Launch();
        }

        /// <summary>Start (once) and return the client when ready. Failures also raise Failed and go to the log.</summary>
        public Task<SidecarClient> Launch()
        {
            if (launch == null)
                launch = LaunchAsync();
            return launch;
        }

        async Task<SidecarClient> LaunchAsync()
        {
            try
            {
                SidecarClient client;
                if (!string.IsNullOrEmpty(attachAddress))
                {
                    var token = string.IsNullOrEmpty(attachToken) ? Environment.GetEnvironmentVariable("XLM_SIDECAR_TOKEN") : attachToken;
                    client = new SidecarClient(attachAddress, token);
                    await client.GetStatusAsync(lifetime.Token);
                }
                else
                {
                    var started = await SidecarProcess.StartAsync(Options(), lifetime.Token);
                    if (lifetime.IsCancellationRequested)
                    {
                        started.Dispose();
                        throw new OperationCanceledException(lifetime.Token);
                    }
                    process = started;
                    started.Exited += code =>
                    {
                        if (process != started)
                            return; // stopped by this component: expected
                        Debug.LogWarning("xlm-sidecar exited with code " + code + "\n" + started.Tail());
                        Client = null;
                        var exited = DaemonExited;
                        if (exited != null) exited(code);
                    };
                    if (forwardDaemonWarnings)
                        started.LogLine += ForwardLogLine;
                    client = started.Client;
                }
                Client = client;
                var ready = Ready;
                if (ready != null) ready(client);
                return client;
            }
            catch (OperationCanceledException) when (lifetime.IsCancellationRequested)
            {
                throw; // the component went away while the daemon was starting
            }
            catch (Exception e)
            {
                Debug.LogException(e, this);
                var failed = Failed;
                if (failed != null) failed(e);
                throw;
            }
        }

        SidecarLaunchOptions Options()
        {
            var options = new SidecarLaunchOptions
            {
                ExecutablePath = string.IsNullOrEmpty(executablePath) ? DefaultExecutable() : executablePath,
                ModelPath = string.IsNullOrEmpty(modelPath) ? null : modelPath,
                ProjectorPath = string.IsNullOrEmpty(projectorPath) ? null : projectorPath,
                Budget = string.IsNullOrEmpty(budget) ? "0" : budget,
                MaxCpuThreads = maxCpuThreads > 0 ? (int?)maxCpuThreads : null,
                Port = port,
                SocketPath = string.IsNullOrEmpty(socketPath) ? null : socketPath,
                StartTimeout = TimeSpan.FromSeconds(startTimeoutSeconds),
            };
            options.ExtraArguments.AddRange(extraArguments);
            return options;
        }

        static string DefaultExecutable()
        {
            var windows = Application.platform == RuntimePlatform.WindowsPlayer || Application.platform == RuntimePlatform.WindowsEditor;
            var bundled = Path.Combine(Path.Combine(Application.streamingAssetsPath, "xlm-sidecar"), windows ? "xlm-sidecar.exe" : "xlm-sidecar");
            return File.Exists(bundled) ? bundled : "xlm-sidecar";
        }

        void ForwardLogLine(string line)
        {
            // Only the daemon's JSON lines carry a level; anything else is llama.cpp chatter.
            if (line.IndexOf("\"level\": \"error\"", StringComparison.Ordinal) >= 0 || line.IndexOf("\"level\":\"error\"", StringComparison.Ordinal) >= 0)
                Debug.LogError("xlm-sidecar: " + line);
            else if (line.IndexOf("\"level\": \"warning\"", StringComparison.Ordinal) >= 0 || line.IndexOf("\"level\":\"warning\"", StringComparison.Ordinal) >= 0)
                Debug.LogWarning("xlm-sidecar: " + line);
        }

        void Update()
        {
            // The frame that just ended goes into the window; once a second of frames is in, the
            // report goes out on a worker thread (never waited for here; failures are logged once).
            var client = Client;
            if (!reportFrames || client == null)
                return;
            if (frames == null || frames.Client != client)
                frames = new FrameReporter(client) { Log = message => Debug.LogWarning(message) };
            frames.IntervalS = frameReportInterval;
            frames.FrameBudgetMs = FrameStats.BudgetForFrameRate(targetFrameRate > 0 ? targetFrameRate : Application.targetFrameRate);
            frames.AddFrame(Time.unscaledDeltaTime * 1000.0);
        }

        void OnApplicationPause(bool paused)
        {
            // The first frame after a pause spans the pause: not a frame the game struggled with.
            if (frames != null)
                frames.Reset();
        }

        void OnApplicationQuit()
        {
            Shutdown();
        }

        void OnDestroy()
        {
            Shutdown();
        }

        void Shutdown()
        {
            if (!lifetime.IsCancellationRequested)
                lifetime.Cancel();
            var client = Client;
            Client = null;
            frames = null;
            var running = process;
            process = null;
            if (running != null)
            {
                running.Dispose(); // disposes its client too
            }
            else if (client != null)
            {
                client.Dispose();
            }
        }
    }
}
