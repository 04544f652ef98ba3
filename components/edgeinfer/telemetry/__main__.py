from edgeinfer.telemetry.component import main

raise SystemExit(main())
