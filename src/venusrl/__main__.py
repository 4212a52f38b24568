from venusrl.cli import main

main()
