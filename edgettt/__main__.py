from edgettt.cli import main

main()
