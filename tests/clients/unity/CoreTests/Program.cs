namespace Xlm.Sidecar.Tests
{
    /// <summary>The client core's tests: JSON, the client against a live daemon, the launcher.</summary>
    public static class Program
    {
        public static int Main(string[] args)
        {
            if (args.Length == 1 && args[0] == "--launch-and-crash")
                return LauncherTests.LaunchAndCrash();
            if (args.Length == 2 && (args[0] == "--proto-encode" || args[0] == "--proto-decode"))
                return Transports.ProtoTool(args);
            if (args.Length == 1 && args[0] == "--frame-report")
                return FrameTests.ReportTool();
            JsonTests.Register();
            ClientTests.Register();
            ToolTests.Register();
            TokenControlTests.Register();
            FrameTests.Register();
            SaveTests.Register();
            MemoryTests.Register();
            LauncherTests.Register();
            return TestRunner.Run(args);
        }
    }
}
