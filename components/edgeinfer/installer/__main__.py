from edgeinfer.installer.component import main

raise SystemExit(main())
