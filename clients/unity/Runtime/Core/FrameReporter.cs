using System;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// Tells the daemon how the game's frames go: fed each frame's time on the main thread, it sends
    /// a FrameReport (ReportFrames) once per IntervalS of frames, off the main thread, and never waits
    /// for the answer. The daemon's frame-time guard then keeps out of the game's way (fewer threads,
    /// shorter passes, pauses between them). A report still unanswered when the next is due makes
    /// that window be dropped rather than queued. Failures never reach the caller: the first is
    /// passed to Log (again only after a report has gone through since); a daemon without
    /// ReportFrames (UNIMPLEMENTED) stops the reports.
    /// </summary>
    public sealed class FrameReporter
    {
        public const double DefaultIntervalS = 1.0;
        /// <summary>The daemon refuses more than 20 reports a second.</summary>
        public const double MinIntervalS = 0.1;

        readonly SidecarClient client;
        readonly FrameStats stats = new FrameStats();
        double intervalS = DefaultIntervalS;
        double frameBudgetMs = FrameStats.DefaultBudgetMs;
        int inFlight;
        int failureLogged;
        volatile bool stopped;
        volatile FrameGuardState guard;
        Task pending = Task.FromResult(0);

        public FrameReporter(SidecarClient client)
        {
            if (client == null)
                throw new ArgumentNullException("client");
            this.client = client;
            Enabled = true;
        }

        public SidecarClient Client { get { return client; } }

        /// <summary>False: frames are neither gathered nor sent.</summary>
        public bool Enabled { get; set; }

        /// <summary>Frame time (seconds) each report covers; at least MinIntervalS.</summary>
        public double IntervalS
        {
            get { return intervalS; }
            set { intervalS = double.IsNaN(value) ? DefaultIntervalS : Math.Max(MinIntervalS, value); }
        }

        /// <summary>The game's frame budget (FrameStats.BudgetForFrameRate(targetFps)); frames over it
        /// are counted. 0: the daemon's --frame-budget-ms.</summary>
        public double FrameBudgetMs
        {
            get { return frameBudgetMs; }
            set { frameBudgetMs = value > 0 ? Math.Max(1.0, Math.Min(1000.0, value)) : 0; }
        }

        /// <summary>The daemon's last answer (what its guard does now), or null before the first.</summary>
        public FrameGuardState Guard { get { return guard; } }
        /// <summary>True once a daemon without ReportFrames said so: nothing more is sent.</summary>
        public bool Stopped { get { return stopped; } }
        /// <summary>Reports the daemon answered, and windows dropped because one was still out.</summary>
        public int Answered { get; private set; }
        public int Dropped { get; private set; }
        /// <summary>The send of the last report (completes, never fails): for tests and shutdown.</summary>
        public Task Pending { get { return pending; } }

        /// <summary>Where the first failure is told (e.g. Unity's Debug.LogWarning); null: nowhere.</summary>
        public Action<string> Log;
        /// <summary>Each answer, on the client's event context (Unity's main thread).</summary>
        public event Action<FrameGuardState> Reported;

        /// <summary>One frame, on the main thread: its time and the GPU's (0: not measured). Returns
        /// true when this frame completed a window and its report went out.</summary>
        public bool AddFrame(double frameMs, double gpuFrameMs = 0)
        {
            if (!Enabled || stopped)
                return false;
            stats.Add(frameMs, gpuFrameMs);
            if (stats.TotalMs < intervalS * 1000.0 && stats.Count < FrameStats.MaxFrames)
                return false; // the window is not over (nor full)
            if (Interlocked.CompareExchange(ref inFlight, 1, 0) != 0)
            {
                // The daemon has not answered the last one: start a fresh window instead of piling up.
                stats.Reset();
                Dropped++;
                return false;
            }
            var report = stats.TakeReport(0, frameBudgetMs);
            pending = Task.Run(() => SendAsync(report));
            return true;
        }

        /// <summary>Forget the frames of the window so far (after a pause, a loading screen).</summary>
        public void Reset()
        {
            stats.Reset();
        }

        async Task SendAsync(FrameReport report)
        {
            try
            {
                var state = await client.ReportFramesAsync(report).ConfigureAwait(false);
                guard = state;
                Answered++;
                Interlocked.Exchange(ref failureLogged, 0);
                var reported = Reported;
                if (reported != null)
                    client.Dispatcher.Post(() => reported(state));
            }
            catch (Exception e)
            {
                var unimplemented = e is SidecarException && ((SidecarException)e).Code == SidecarStatusCode.Unimplemented;
                if (unimplemented)
                    stopped = true;
                if (Interlocked.Exchange(ref failureLogged, 1) == 0)
                    Tell("xlm-sidecar: frame report failed (" + e.Message + ")" +
                         (unimplemented ? "; this daemon has no ReportFrames, so no more are sent" : "; the reports go on"));
            }
            finally
            {
                Interlocked.Exchange(ref inFlight, 0);
            }
        }

        void Tell(string message)
        {
            var log = Log;
            if (log == null)
                return;
            try
            {
                log(message);
            }
            catch (Exception)
            {
                // A logger that throws must not break the reports.
            }
        }
    }
}
