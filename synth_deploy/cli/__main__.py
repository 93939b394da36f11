from synth_deploy.cli import main

main()
