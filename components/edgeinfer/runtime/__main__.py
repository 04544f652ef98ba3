from edgeinfer.runtime.component import main

raise SystemExit(main())
