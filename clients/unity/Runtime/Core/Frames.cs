using System;
using System.Collections.Generic;

namespace Xlm.Sidecar
{
    // The game's frame times (ReportFrames) and what the daemon's frame-time guard does about them.

    /// <summary>One window of the game's frames (xlm.v1.FrameReport), figures in milliseconds.
    /// FrameStats makes one from the frames it was given; FrameReporter sends one a second.</summary>
    public sealed class FrameReport
    {
        /// <summary>Frames in the window (1 to 100000).</summary>
        public uint Frames;
        /// <summary>The window's length (up to 60000 ms).</summary>
        public double WindowMs;
        public double FrameMsP50;
        public double FrameMsP99;
        public double FrameMsMax;
        /// <summary>Frames that took longer than FrameBudgetMs.</summary>
        public uint FramesOverBudget;
        /// <summary>The game's frame budget (16.67 at 60 fps); 0: the daemon's --frame-budget-ms.</summary>
        public double FrameBudgetMs;
        /// <summary>The GPU's frame time where the game measures it; 0: not measured.</summary>
        public double GpuFrameMsP99;

        internal JsonObject ToJson()
        {
            return new JsonObject
            {
                { "frames", Frames },
                { "windowMs", WindowMs },
                { "frameMsP50", FrameMsP50 },
                { "frameMsP99", FrameMsP99 },
                { "frameMsMax", FrameMsMax },
                { "framesOverBudget", FramesOverBudget },
                { "frameBudgetMs", FrameBudgetMs },
                { "gpuFrameMsP99", GpuFrameMsP99 },
            };
        }
    }

    /// <summary>What the daemon's frame-time guard sees of the game and does about it
    /// (xlm.v1.FrameGuardState): ReportFrames' answer, and Status.FrameGuard.</summary>
    public sealed class FrameGuardState
    {
        /// <summary>False when the daemon runs with --no-frame-guard: nothing below is applied.</summary>
        public bool Enabled;
        /// <summary>"frame reports", "watching the game process", "machine load" or "nothing seen".</summary>
        public string Source;
        public double FrameBudgetMs;
        /// <summary>Threads per pass now (0: the plan's).</summary>
        public uint MaxThreads;
        /// <summary>Tokens per pass now (0: the plan's batch).</summary>
        public uint MaxPassTokens;
        /// <summary>The pause after each pass.</summary>
        public double PauseMs;
        /// <summary>Whether the daemon runs below the game's scheduling priority.</summary>
        public bool LowPriority;
        /// <summary>Below that: the idle scheduling class, taken once the game keeps every core busy or its frames run late.</summary>
        public bool IdleClass;
        /// <summary>Why, in a sentence.</summary>
        public string Reason;
        public double GameFrameMsP99;
        public double GameOverBudgetShare;
        public double GameBusyCores;
        public uint GameBusyThreads;
        /// <summary>How many times the levers moved since the daemon started.</summary>
        public ulong Changes;
        public ulong Reports;
        public JsonObject Json;

        internal static FrameGuardState FromJson(JsonObject json)
        {
            json = json ?? new JsonObject();
            return new FrameGuardState
            {
                Enabled = json.GetBool("enabled"),
                Source = json.GetString("source"),
                FrameBudgetMs = json.GetDouble("frameBudgetMs"),
                MaxThreads = json.GetUInt32("maxThreads"),
                MaxPassTokens = json.GetUInt32("maxPassTokens"),
                PauseMs = json.GetDouble("pauseMs"),
                LowPriority = json.GetBool("lowPriority"),
                IdleClass = json.GetBool("idleClass"),
                Reason = json.GetString("reason"),
                GameFrameMsP99 = json.GetDouble("gameFrameMsP99"),
                GameOverBudgetShare = json.GetDouble("gameOverBudgetShare"),
                GameBusyCores = json.GetDouble("gameBusyCores"),
                GameBusyThreads = json.GetUInt32("gameBusyThreads"),
                Changes = json.GetUInt64("changes"),
                Reports = json.GetUInt64("reports"),
                Json = json,
            };
        }
    }

    /// <summary>
    /// Frame times gathered over a window, then summed up as a FrameReport: the median, the 99th
    /// percentile (nearest rank) and the longest frame, and how many frames went over the budget.
    /// Not thread-safe: feed it from one thread (the main thread, once a frame).
    /// </summary>
    public sealed class FrameStats
    {
        /// <summary>60 fps.</summary>
        public const double DefaultBudgetMs = 1000.0 / 60.0;
        /// <summary>The longest frame and window the daemon takes; longer ones are counted as this.</summary>
        public const double MaxMs = 60000.0;
        /// <summary>The most frames one report may carry.</summary>
        public const int MaxFrames = 100000;

        readonly List<double> frames = new List<double>();
        readonly List<double> gpuFrames = new List<double>();
        double totalMs;

        /// <summary>Frames since the last TakeReport.</summary>
        public int Count { get { return frames.Count; } }
        /// <summary>Their times added up: the window they cover.</summary>
        public double TotalMs { get { return totalMs; } }

        /// <summary>One frame's time, and the GPU's for it where measured (0: not measured). A time
        /// that is not a number or below 0 is ignored, one over MaxMs counts as MaxMs, and frames past
        /// MaxFrames in one window are dropped until the next report (FrameReporter sends a full
        /// window early).</summary>
        public void Add(double frameMs, double gpuFrameMs = 0)
        {
            if (double.IsNaN(frameMs) || frameMs < 0 || frames.Count >= MaxFrames)
                return;
            frameMs = Math.Min(frameMs, MaxMs);
            frames.Add(frameMs);
            totalMs += frameMs;
            if (gpuFrameMs > 0 && !double.IsNaN(gpuFrameMs))
                gpuFrames.Add(Math.Min(gpuFrameMs, MaxMs));
        }

        /// <summary>The report of the frames so far, over `windowMs` (their TotalMs when 0 or less),
        /// with frames over `budgetMs` counted; then starts again. Null when no frame came.</summary>
        public FrameReport TakeReport(double windowMs, double budgetMs)
        {
            if (frames.Count == 0)
                return null;
            var sorted = new List<double>(frames);
            sorted.Sort();
            uint over = 0;
            foreach (var ms in frames)
                if (budgetMs > 0 && ms > budgetMs)
                    over++;
            var report = new FrameReport
            {
                Frames = (uint)sorted.Count,
                WindowMs = Math.Min(windowMs > 0 ? windowMs : totalMs, MaxMs),
                FrameMsP50 = Percentile(sorted, 0.50),
                FrameMsP99 = Percentile(sorted, 0.99),
                FrameMsMax = sorted[sorted.Count - 1],
                FramesOverBudget = over,
                FrameBudgetMs = budgetMs > 0 ? budgetMs : 0,
            };
            if (gpuFrames.Count > 0)
            {
                gpuFrames.Sort();
                report.GpuFrameMsP99 = Percentile(gpuFrames, 0.99);
            }
            // A window of 0 ms (frames of 0 ms: a clock too coarse) is no window at all.
            if (report.WindowMs <= 0)
                report.WindowMs = Math.Max(report.FrameMsMax, 0.001);
            Reset();
            return report;
        }

        public void Reset()
        {
            frames.Clear();
            gpuFrames.Clear();
            totalMs = 0;
        }

        /// <summary>The frame budget of a target frame rate: 1000 / fps, 60 fps where the rate is 0 or
        /// less (Unity's targetFrameRate -1: as fast as it goes), kept within the 1 to 1000 ms the
        /// daemon takes.</summary>
        public static double BudgetForFrameRate(double framesPerSecond)
        {
            var budget = framesPerSecond > 0 ? 1000.0 / framesPerSecond : DefaultBudgetMs;
            return Math.Max(1.0, Math.Min(1000.0, budget));
        }

        /// <summary>The nearest-rank percentile `q` (0 to 1) of ascending `sorted` values.</summary>
        public static double Percentile(List<double> sorted, double q)
        {
            if (sorted == null || sorted.Count == 0)
                return 0;
            var rank = (int)Math.Ceiling(q * sorted.Count);
            return sorted[Math.Max(0, Math.Min(sorted.Count - 1, rank - 1))];
        }
    }
}
